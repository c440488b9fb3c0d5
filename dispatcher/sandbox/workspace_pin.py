"""Pinning a workspace (or a grant under it) and handing Docker exactly the pinned directory.

A sandbox controls the contents of its workspace, and a workspace may contain another session's
workspace (``w`` and ``w/x``). So between the moment the server checks a path and the moment Docker
bind-mounts it, a sandbox may have replaced a component with a symlink to any host directory. The
cure is to never give Docker a name a sandbox can influence:

1. ``open_pinned`` walks down from the tenant's root (trusted: it comes from the config) one
   component at a time with ``openat(O_NOFOLLOW | O_DIRECTORY)``: a symlink or a file anywhere on
   the way is refused, missing directories are created (and only those are handed to the sandbox
   user; nothing that exists is ever re-owned). The result is a directory fd that no later rename or symlink can redirect.
2. ``Stage`` bind-mounts each pinned fd (``/proc/self/fd/N``, which the kernel resolves to the
   pinned directory itself, not to a name) onto a fresh directory under the server's own run
   directory. Docker gets that staging path; every component of it belongs to the server.
3. Once the container has started it holds its own copy of the mount, so the staging mounts are
   detached (``umount -l``) and their directories removed.

Without root (no mount(2)) the pinned path is checked again after the container started: the
container's ``/workspace`` must be the pinned inode, or the container is destroyed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from dispatcher.core.errors import ToolPermissionDenied
from dispatcher.core.sandbox_api import SandboxError

log = logging.getLogger(__name__)

MS_BIND = 0x1000
MNT_DETACH = 0x2
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MARKER_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_libc: ctypes.CDLL | None = None


class WorkspaceRefused(ToolPermissionDenied):
    """The workspace or a granted directory cannot be mounted safely (a link or a file in the way).

    A tool error, not a sandbox failure: the call fails with this message and nothing is retried,
    mounted or handed over.
    """


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def bind_mount(source: str, target: str) -> None:
    """``mount --bind source target`` (not recursive: submounts of the source stay out).

    Raises:
        OSError: mount(2) failed.
    """
    if _lib().mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bind mount onto {target}: {os.strerror(err)}")


MS_SHARED = 1 << 20


def make_shared_mount(path: str) -> None:
    """Bind ``path`` onto itself and make that mount shared: what is later mounted on it propagates
    to every mount made from it with ``rslave`` (a warm pool's slot, ``docker/pool/``).

    Raises:
        OSError: mount(2) failed (what was mounted stays; ``detach_mount`` undoes it).
    """
    bind_mount(path, path)
    if _lib().mount(None, path.encode(), None, MS_SHARED, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"make {path} a shared mount: {os.strerror(err)}")


def detach_mount(target: str) -> None:
    """``umount -l target``: gone from the host now, kept by whoever still uses it.

    Raises:
        OSError: umount2(2) failed.
    """
    if _lib().umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unmount {target}: {os.strerror(err)}")


def split_relative(path: str, what: str) -> list[str]:
    """The components of a relative path, refusing ``..``, ``.``-only tricks and NUL bytes.

    Raises:
        WorkspaceRefused: an absolute path, ``..`` or a NUL byte.
    """
    if path in ("", "."):
        return []
    if path.startswith("/") or "\x00" in path:
        raise WorkspaceRefused(f"{what} {path!r} must be a relative path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspaceRefused(f"{what} {path!r} must not contain '..'")
    return parts


def open_pinned(
    root: str | int,
    parts: Sequence[str],
    *,
    create: bool,
    owner: tuple[int, int] | None,
    what: str,
) -> int | None:
    """A directory fd for ``root/parts...``, reached without following any link (blocking).

    ``root`` is a trusted path (the tenant's root, from the config) or an already pinned fd.
    Missing components are created (mode 0755) when ``create`` is set, and only those are handed
    to ``owner``; returns None when a component is missing and ``create`` is not set.

    Raises:
        WorkspaceRefused: a component is a symlink or not a directory.
        SandboxError: a component cannot be opened or made.
    """
    try:
        fd = os.dup(root) if isinstance(root, int) else os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(f"{what}: the workspace root {root} cannot be opened: {exc.strerror}") from None
    try:
        for i, part in enumerate(parts):
            shown = "/".join(parts[: i + 1])
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise WorkspaceRefused(f"{what}: {shown!r} is not a plain directory name")
            child, made = _open_child(fd, part, create=create, shown=shown, what=what)
            if child is None:
                return None
            os.close(fd)
            fd = child
            if made and owner is not None and os.geteuid() == 0:
                os.fchown(fd, *owner)
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _open_child(fd: int, part: str, *, create: bool, shown: str, what: str) -> tuple[int | None, bool]:
    made = False
    for _ in range(3):  # a concurrent mkdir/rmdir of the same name: try again
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd), made
        except FileNotFoundError:
            if not create:
                return None, False
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise WorkspaceRefused(
                    f"{what}: {shown!r} is a symbolic link or not a directory; refusing to mount it"
                ) from None
            raise SandboxError(f"{what}: cannot open {shown!r}: {exc.strerror}") from None
    raise SandboxError(f"{what}: {shown!r} keeps changing; refusing to mount it")


def note_unwritable(fd: int, owner: tuple[int, int] | None, name: str) -> None:
    """Log when the sandbox user cannot write its workspace (root-owned, say); never re-own it.

    CreateSession makes workspaces already owned by the sandbox user, so this only meets a
    directory someone else made; whose files those are is theirs to decide (``chown`` it).
    """
    if owner is None:
        return
    st = os.fstat(fd)
    if (
        st.st_uid != owner[0]
        and not st.st_mode & 0o002
        and not (st.st_gid == owner[1] and st.st_mode & 0o020)
    ):
        log.warning(
            "workspace %r belongs to uid %d, not to the sandbox user %d:%d, and is not writable for it; "
            "the sandbox can only read it (chown it, or set sandbox.user)",
            name,
            st.st_uid,
            *owner,
        )


@dataclass(frozen=True, slots=True)
class PinnedMount:
    """One directory to bind into the sandbox: where, how, and the fd that pins it."""

    fd: int
    target: str
    read_only: bool
    host_path: str
    """The pinned path as walked (for messages and the non-root fallback only)."""


@dataclass(slots=True)
class Stage:
    """Staging mounts of pinned directories, alive from container creation until it has started."""

    run_dir: str
    pinned: list[PinnedMount] = field(default_factory=list)
    empty_root: bool = False
    """The workspace itself is not mounted (fs grants without "."): an empty read-only tmpfs."""
    sources: list[str] = field(default_factory=list)
    """Per pinned mount, the path Docker gets as the bind source."""
    staged: bool = False
    markers: list[tuple[str, str]] = field(default_factory=list)
    """(target, file name) of the markers made by ``use_paths``."""
    _dir: str | None = None
    _mounted: list[str] = field(default_factory=list)

    def bind_all(self, name: str) -> None:
        """Bind every pinned fd onto a private staging directory (root only; blocking).

        Raises:
            SandboxError: a mount failed (what was mounted is undone).
        """
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        self._dir = os.path.join(self.run_dir, f"{name}-{secrets.token_hex(4)}")
        os.mkdir(self._dir, 0o700)
        try:
            for i, pin in enumerate(self.pinned):
                target = os.path.join(self._dir, str(i))
                os.mkdir(target, 0o700)
                bind_mount(f"/proc/self/fd/{pin.fd}", target)
                self._mounted.append(target)
                self.sources.append(target)
        except OSError as exc:
            self.release()
            raise SandboxError(f"cannot stage the workspace mount: {exc}") from exc
        self.staged = True

    def use_paths(self, *, markers: bool = False) -> None:
        """Without mount(2): Docker gets the walked paths, to be verified after start.

        With ``markers``, an empty file is made through each pinned fd (removed by ``release``),
        for runtimes that do not show host inode numbers.

        Raises:
            SandboxError: a marker cannot be made (the server may not write there).
        """
        self.sources = [pin.host_path for pin in self.pinned]
        if not markers:
            return
        for pin in self.pinned:
            name = f".dispatcher-pin-{secrets.token_hex(8)}"
            try:
                os.close(os.open(name, _MARKER_FLAGS, 0o644, dir_fd=pin.fd))
            except OSError as exc:
                raise SandboxError(
                    f"cannot verify the workspace mount without root: {pin.host_path}: {exc.strerror}"
                ) from None
            self.markers.append((pin.target, name))

    def identities(self) -> list[tuple[str, int, int]]:
        """(target, st_dev, st_ino) of every pinned directory."""
        out: list[tuple[str, int, int]] = []
        for pin in self.pinned:
            st = os.fstat(pin.fd)
            out.append((pin.target, st.st_dev, st.st_ino))
        return out

    def release(self) -> None:
        """Detach the staging mounts and close the fds; safe to call twice (blocking)."""
        for target in reversed(self._mounted):
            try:
                detach_mount(target)
            except OSError as exc:
                log.warning("could not detach staging mount %s: %s", target, exc)
                continue
            with contextlib.suppress(OSError):
                os.rmdir(target)
        self._mounted.clear()
        if self._dir is not None:
            with contextlib.suppress(OSError):
                for leftover in os.listdir(self._dir):
                    os.rmdir(os.path.join(self._dir, leftover))
                os.rmdir(self._dir)
            self._dir = None
        by_target = {pin.target: pin.fd for pin in self.pinned}
        for target, name in self.markers:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=by_target[target])
        self.markers = []
        for pin in self.pinned:
            with contextlib.suppress(OSError):
                os.close(pin.fd)
        self.pinned = []


def pin_session_mounts(
    root: str,
    workspace: Sequence[str],
    grants: Sequence[tuple[str, str]] | None,
    *,
    owner: tuple[int, int] | None,
    target: str,
) -> tuple[list[PinnedMount], bool]:
    """Pin the workspace and, with fs grants, each granted directory (blocking).

    Without grants the workspace is bound read-write at ``target``. With grants (``(prefix,
    mode)``), ``target`` is the workspace bound with the mode of a ``.`` grant, or (second value
    True) an empty read-only tmpfs; each other granted directory is bound at ``target/prefix``
    with its mode. A missing ``rw`` grant directory is created; a missing ``r`` one is left out.

    Raises:
        WorkspaceRefused: a symlink or a non-directory on any of these paths, or a bad grant prefix.
        SandboxError: a directory cannot be opened or made.
    """
    name = "/".join(workspace) or "."
    base = os.path.join(root, *workspace)
    leaf = open_pinned(root, workspace, create=True, owner=owner, what=f"workspace {name!r}")
    assert leaf is not None  # create=True never returns None
    pins: list[PinnedMount] = []
    keep_leaf = False
    try:
        note_unwritable(leaf, owner, name)
        if grants is None:
            pins.append(PinnedMount(leaf, target, False, base))
            keep_leaf = True
            return pins, False
        modes: dict[tuple[str, ...], str] = {}
        for prefix, mode in grants:
            key = tuple(split_relative(prefix, "fs grant"))
            modes[key] = "rw" if "rw" in (mode, modes.get(key)) else "r"
        for parts, mode in sorted(modes.items()):
            if not parts:
                continue
            shown = "/".join(parts)
            fd = open_pinned(leaf, parts, create=mode == "rw", owner=owner, what=f"fs grant {shown!r}")
            if fd is not None:
                pins.append(PinnedMount(fd, f"{target}/{shown}", mode == "r", os.path.join(base, *parts)))
        whole = modes.get(())
        if whole is None:
            return pins, True
        pins.insert(0, PinnedMount(leaf, target, whole == "r", base))
        keep_leaf = True
        return pins, False
    except BaseException:
        for pin in pins:
            if pin.fd != leaf:
                os.close(pin.fd)
        raise
    finally:
        if not keep_leaf:
            os.close(leaf)
