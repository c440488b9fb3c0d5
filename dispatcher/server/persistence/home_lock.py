"""One server per home: an ``flock`` on ``<home>/server.lock``, held for the life of the process."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from dispatcher.server.persistence.errors import StateError

LOCK_FILE = "server.lock"


class HomeLock:
    """The exclusive lock of a server home; the file holds the holder's pid (for the message)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or fail at once.

        Raises:
            StateError: another server holds it (naming the home and that server's pid), or the
                file cannot be made.
        """
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot open the server lock: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StateError(
                f"another dispatcher server ({who}) is already serving the home {self.home};"
                " stop it first, or give this one its own --home"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StateError(f"{self.path}: cannot lock: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0)
        return int(raw.decode().strip())
    except (OSError, ValueError):
        return None
