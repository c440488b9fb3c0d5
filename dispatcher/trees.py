"""Client side of UploadFiles / DownloadFiles: a local tree as a tar stream, and back.

``tar_chunks`` packs a directory lazily (headers from ``tarfile``, contents read piece by piece),
so a big tree is never held in memory. ``TarExtractor`` unpacks a downloaded stream member by
member with ``tarfile``'s ``data`` filter (nothing lands outside the target directory; links that
would leave it, devices and absolute names are skipped and reported), files owned by whoever runs
the client.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

CHUNK = 1 << 20  # bytes per UploadFilesRequest chunk (well under the 4 MiB message limit)
_BLOCK = tarfile.BLOCKSIZE


class LocalTreeError(ValueError):
    """The local tree cannot be uploaded as it is (a link leaving it, a device, an unreadable file)."""


def _entries(root: str) -> Iterator[tuple[str, str]]:
    """(absolute path, archive name) of every entry below ``root``, parents first, names sorted."""
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
        subdirs = []
        for name in names:
            full = os.path.join(path, name)
            arc = f"{rel}{name}"
            yield full, arc
            if stat.S_ISDIR(os.lstat(full).st_mode):
                subdirs.append((f"{arc}/", full))
        stack.extend(reversed(subdirs))


def _link_inside(full: str, arc: str) -> str:
    """The target of the symlink ``full`` (archive name ``arc``) when the agent will accept it:
    relative, staying inside the uploaded tree, no ``..`` after a name.

    Raises:
        LocalTreeError: naming the link and why.
    """
    target = os.readlink(full)
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    landed = posixpath.normpath(posixpath.join(posixpath.dirname(arc), target)) if target else ".."
    if target.startswith("/") or ".." in parts[ups:] or landed == ".." or landed.startswith("../"):
        raise LocalTreeError(
            f"{full}: a symbolic link to {target!r}; uploads carry only relative links that stay "
            "inside the uploaded tree"
        )
    return target


def tar_chunks(local_dir: str, *, chunk: int = CHUNK) -> Iterator[bytes]:
    """The contents of ``local_dir`` as a tar stream (names relative to it), in ~``chunk`` pieces.

    Regular files keep their mode and mtime; directories too. A relative symlink whose target
    stays inside the tree is carried as a link (the agent makes it, never following it).

    Raises:
        LocalTreeError: the tree holds a special file or a symlink leaving the tree, naming it.
    """
    if not os.path.isdir(local_dir):
        raise LocalTreeError(f"{local_dir}: not a directory")
    pending = bytearray()
    for full, arc in _entries(local_dir):
        st = os.lstat(full)
        info = tarfile.TarInfo(arc)
        info.mode = stat.S_IMODE(st.st_mode) & 0o777
        info.mtime = int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISREG(st.st_mode):
            info.size = st.st_size
        elif stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = _link_inside(full, arc)
            info.mode = 0o777
        else:
            raise LocalTreeError(
                f"{full}: not a regular file, directory or symbolic link; uploads carry only those"
            )
        pending += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.isreg():
            with open(full, "rb") as f:
                left = info.size
                while left:
                    data = f.read(min(left, chunk))
                    if not data:  # shrank meanwhile: the header promised info.size bytes
                        data = bytes(min(left, chunk))
                    pending += data
                    left -= len(data)
                    if len(pending) >= chunk:
                        yield bytes(pending)
                        pending.clear()
            pending += bytes(-info.size % _BLOCK)
        if len(pending) >= chunk:
            yield bytes(pending)
            pending.clear()
    pending += bytes(2 * _BLOCK)  # end of archive
    yield bytes(pending)


class _ChunkReader:
    """A file object over an iterator of byte chunks (what ``tarfile`` streaming mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return b""
            self._buf = memoryview(nxt)
        size = len(self._buf) if size < 0 else size
        out = bytes(self._buf[:size])
        self._buf = self._buf[size:]
        return out


@dataclass(slots=True)
class Extracted:
    """What a download wrote locally."""

    files: int = 0
    directories: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    """Members the ``data`` filter refused (links leaving the tree, devices), with the reason."""


def _owner_less(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    safe = tarfile.data_filter(member, dest)
    if safe is None:
        return None
    # None: tarfile leaves the owner alone (the stubs do not know that yet).
    return safe.replace(uid=None, gid=None, uname=None, gname=None, deep=False)  # type: ignore[arg-type]


def extract_chunks(chunks: Iterable[bytes], local_dir: str) -> Extracted:
    """Unpack a tar stream into ``local_dir`` (made if missing), member by member, safely."""
    os.makedirs(local_dir, exist_ok=True)
    done = Extracted()
    dirs: list[tarfile.TarInfo] = []
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            try:
                safe = _owner_less(member, local_dir)
            except tarfile.FilterError as exc:
                done.skipped.append(f"{member.name}: {exc}")
                continue
            if safe is None:
                continue
            # A directory's mode and mtime are set last: filling it would change them.
            tar.extract(safe, local_dir, set_attrs=not safe.isdir(), filter="fully_trusted")
            if safe.isdir():
                # The data filter leaves directory modes to the umask; keep them, minus g/o write.
                dirs.append(safe.replace(mode=member.mode & 0o755, deep=False))
                done.directories += 1
            elif safe.isreg():
                done.files += 1
                done.bytes += safe.size
    for info in sorted(dirs, key=lambda d: d.name.count("/"), reverse=True):
        path = os.path.join(local_dir, info.name)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, info.mode)
            os.utime(path, (info.mtime, info.mtime))
    return done
