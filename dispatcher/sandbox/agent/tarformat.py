"""The tar format, read and written directly (ustar, PAX and GNU long names), for uploads and downloads.

``tarfile`` is generic: every member goes through TarInfo objects, copies of every block and a
file-object layer per member; for a tree of many small files that costs more than the files' own
system calls. This reads headers straight from the upload's chunks and hands file contents out as
views of those chunks (written to disk without a copy), and writes download headers as bytes.

What it accepts follows ``tarfile``'s stream mode: a bad header at the start is an error, one later
(or the end of the data at a member boundary) ends the archive; an extended header (PAX, GNU long
name) must be followed by its member. Extended headers are bounded (``MAX_EXTENDED``), which
``tarfile`` does not do. Safety checks on the members are the caller's (``upload.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

BLOCK = 512
RECORD = 20 * BLOCK  # an archive is padded to a whole record, as tar and tarfile do
MAX_EXTENDED = 1 << 20  # bytes of one PAX or GNU long-name header
REGULAR = frozenset({b"0", b"\x00", b"7"})  # file, old-style file, contiguous file
DIRECTORY, SYMLINK = b"5", b"2"
_GNU_LONGNAME, _GNU_LONGLINK, _GNU_SPARSE = b"L", b"K", b"S"
_PAX, _PAX_GLOBAL, _SOLARIS_PAX = b"x", b"g", b"X"
_MAGIC = b"ustar\x00"
_SIGNED = struct.Struct("148b8x356b")
_ZEROS = bytes(BLOCK)
MAX_MODE = 0o7777777  # what the ustar field holds (type bits included, as some writers put them)
MAX_ID = (1 << 32) - 1  # uid_t and gid_t
MAX_SIZE = (1 << 63) - 1  # off_t
MAX_MTIME = 1 << 40  # seconds either side of 1970 (about year 36,800): os.utime overflows far past it
_NO_CONTENTS = frozenset({DIRECTORY, SYMLINK, b"1", b"3", b"4", b"6", _GNU_SPARSE})
"""Types whose size is not followed by contents (as tarfile reads them; unknown types have it)."""


class TarFormatError(Exception):
    """The stream is not a tar archive (or breaks one)."""


class BadMember(TarFormatError):
    """A member's header holds a number that is not one, or is out of range; ``member`` names it."""

    def __init__(self, member: str, why: str) -> None:
        super().__init__(why)
        self.member = member


class Truncated(TarFormatError):
    """The stream ended inside a member's contents."""


@dataclass(frozen=True)
class Member:
    """One archive member's header, extended headers applied."""

    name: str
    type: bytes  # one byte, as in the header
    mode: int
    size: int
    mtime: float
    linkname: str
    sparse: bool  # a GNU sparse file, by type or by PAX keys

    def isreg(self) -> bool:
        return self.type in REGULAR and not self.sparse


def _text(raw: bytes) -> str:
    end = raw.find(b"\x00")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")


def _number(raw: bytes) -> int:
    """A numeric field: octal text, or GNU base-256 (first byte 0x80 or 0xff)."""
    if raw[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(raw[1:], "big")
        return value - (256 ** (len(raw) - 1)) if raw[0] == 0xFF else value
    end = raw.find(b"\x00")
    text = (raw if end < 0 else raw[:end]).strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise TarFormatError("invalid header") from None


def _checksum_ok(block: bytes) -> bool:
    stored = _number(block[148:156])
    unsigned = 256 + sum(block) - sum(block[148:156])
    if stored == unsigned:
        return True
    signed: int = 256 + sum(_SIGNED.unpack_from(block))
    return stored == signed


def _pax_records(data: bytes) -> dict[str, str]:
    """``"%d %s=%s\\n"`` records; the length counts the whole record."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)
        if space < 0:
            raise TarFormatError("invalid PAX header")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise TarFormatError("invalid PAX header") from None
        end = pos + length
        if length < 5 or end > len(data) or data[end - 1] != 0x0A:
            raise TarFormatError("invalid PAX header")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq or not key:
            raise TarFormatError("invalid PAX header")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


class TarReader:
    """Members of a tar stream given as chunks (``read`` returns the next one, ``b""`` at the end).

    After ``next`` returns a regular file, its contents must be taken with ``contents`` before
    the next ``next``.
    """

    def __init__(self, read: Callable[[], bytes]) -> None:
        self._read = read
        self._buf = memoryview(b"")
        self._pos = 0
        self._ended = False
        self._started = False
        self._global: dict[str, str] = {}
        self._left = self._pad = 0  # contents and padding of the last member not taken yet

    def _fill(self) -> bool:
        """Make unread bytes available; False at the end of the stream."""
        while self._pos >= len(self._buf):
            if self._ended:
                return False
            data = self._read()
            if not data:
                self._ended = True
                return False
            self._buf, self._pos = memoryview(data), 0
        return True

    def _take(self, size: int) -> bytes:
        """``size`` bytes, fewer only at the end of the stream."""
        pos = self._pos
        if len(self._buf) - pos >= size:
            self._pos = pos + size
            return bytes(self._buf[pos : pos + size])
        parts: list[bytes] = []
        while size and self._fill():
            piece = self._buf[self._pos : self._pos + size]
            parts.append(bytes(piece))
            self._pos += len(piece)
            size -= len(piece)
        return b"".join(parts)

    def contents(self) -> Iterator[memoryview]:
        """The last member's contents as views of the chunks (each valid until the next step),
        then its padding skipped. Raises ``Truncated`` if the stream ends first."""
        while self._left:
            if not self._fill():
                raise Truncated("unexpected end of data")
            pos = self._pos
            piece = self._buf[pos : pos + self._left]
            self._pos = pos + len(piece)
            self._left -= len(piece)
            yield piece
        self._skip(self._pad)
        self._pad = 0

    def _skip(self, size: int) -> None:
        while size:
            if not self._fill():
                raise Truncated("unexpected end of data")
            step = min(size, len(self._buf) - self._pos)
            self._pos += step
            size -= step

    def _extended(self, size: int) -> bytes:
        if size > MAX_EXTENDED:
            raise TarFormatError(f"an extended header of {size} bytes (at most {MAX_EXTENDED})")
        data = self._take(size)
        if len(data) < size:
            raise TarFormatError("unexpected end of data")
        self._skip(-size % BLOCK)
        return data

    def next(self) -> Member | None:
        """The next member, or None at the end of the archive."""
        if self._left or self._pad:
            self._skip(self._left + self._pad)
            self._left = self._pad = 0
        first = not self._started
        self._started = True
        local: dict[str, str] = {}
        longname = longlink = None
        chained = False  # an extended header came: its member must follow
        while True:
            block = self._take(BLOCK)
            if block == _ZEROS and not chained:
                return None  # the end-of-archive marker
            if len(block) < BLOCK or block == _ZEROS or not _checksum_ok(block):
                if not (first or chained):
                    return None  # the end (tarfile's stream mode reads no further either)
                if len(block) < BLOCK:
                    raise TarFormatError("empty file" if not block else "truncated header")
                raise TarFormatError("end of file header" if block == _ZEROS else "bad checksum")
            kind = block[156:157]
            size = _number(block[124:136])
            if size < 0:
                raise TarFormatError("invalid header")
            if kind in (_GNU_LONGNAME, _GNU_LONGLINK):
                text = _text(self._extended(size))
                if kind == _GNU_LONGNAME:
                    longname = text
                else:
                    longlink = text
                chained = True
                continue
            if kind in (_PAX, _PAX_GLOBAL, _SOLARIS_PAX):
                records = _pax_records(self._extended(size))
                (self._global if kind == _PAX_GLOBAL else local).update(records)
                chained = True
                continue
            return self._member(block, kind, size, {**self._global, **local}, longname, longlink)

    def _member(
        self,
        block: bytes,
        kind: bytes,
        size: int,
        pax: dict[str, str],
        longname: str | None,
        longlink: str | None,
    ) -> Member:
        name = _text(block[0:100])
        if block[257:263] == _MAGIC and kind not in (_GNU_LONGNAME, _GNU_LONGLINK, _GNU_SPARSE):
            prefix = _text(block[345:500])
            if prefix:
                name = f"{prefix}/{name}"
        if kind == b"\x00" and name.endswith("/"):
            kind = DIRECTORY
        linkname = _text(block[157:257])
        if longname is not None:
            name = longname
        if longlink is not None:
            linkname = longlink
        name = pax.get("path", name)
        linkname = pax.get("linkpath", linkname)
        if kind == DIRECTORY:
            name = name.rstrip("/")
        mode = _bounded(name, "mode", _number(block[100:108]), MAX_MODE)
        for key, field in (("uid", block[108:116]), ("gid", block[116:124])):
            _bounded(name, key, _pax_int(name, pax, key) if key in pax else _number(field), MAX_ID)
        size = _bounded(name, "size", _pax_int(name, pax, "size") if "size" in pax else size, MAX_SIZE)
        mtime = _mtime(name, pax["mtime"]) if "mtime" in pax else float(_number(block[136:148]))
        if not -MAX_MTIME <= mtime <= MAX_MTIME:
            raise BadMember(name, f"mtime {mtime:g} is out of range (at most {MAX_MTIME} seconds from 1970)")
        sparse = kind == _GNU_SPARSE or any(key.startswith("GNU.sparse.") for key in pax)
        member = Member(name, kind, mode, size, mtime, linkname, sparse)
        self._left = size if kind in REGULAR or kind not in _NO_CONTENTS else 0
        self._pad = -self._left % BLOCK
        return member


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else f"{value[:40]}...")


def _pax_int(name: str, pax: dict[str, str], key: str) -> int:
    value = pax[key]
    if not (value.isascii() and value.isdigit()):  # int() would take "+1", " 1", "1_0"
        raise BadMember(name, f"PAX {key} {_shown(value)} is not a whole number")
    if len(value) > 30:  # past every bound below, and int() of many digits is slow or refused
        raise BadMember(name, f"PAX {key} {_shown(value)} is out of range")
    return int(value)


def _mtime(name: str, value: str) -> float:
    try:
        mtime = float(value)
    except ValueError:
        raise BadMember(name, f"PAX mtime {_shown(value)} is not a number") from None
    if mtime != mtime:
        raise BadMember(name, "PAX mtime is not a number (nan)")
    return mtime


def _bounded(name: str, key: str, value: int, most: int) -> int:
    if not 0 <= value <= most:
        raise BadMember(name, f"{key} {value} is out of range (0 to {most})")
    return value


# -- writing ---------------------------------------------------------------------------------------


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\x00" % (width - 1, value)


def _pax_record(key: bytes, value: bytes) -> bytes:
    body = len(key) + len(value) + 3  # " ", "=", "\n"
    length = prev = 0
    while True:  # the length counts its own digits
        length = body + len(str(prev))
        if length == prev:
            break
        prev = length
    return b"%d %s=%s\n" % (length, key, value)


def _block(
    name: bytes, kind: bytes, mode: int, uid: int, gid: int, size: int, mtime: int, link: bytes
) -> bytes:
    head = b"".join(
        (
            name[:100].ljust(100, b"\x00"),
            _octal(mode & 0o7777, 8),
            _octal(uid, 8),
            _octal(gid, 8),
            _octal(size, 12),
            _octal(mtime, 12),
            b"        ",
            kind,
            link[:100].ljust(100, b"\x00"),
            b"ustar\x0000",
            bytes(64),  # user and group names: none
            _octal(0, 8),
            _octal(0, 8),
            bytes(167),  # prefix (unused: long names go in a PAX header) and padding
        )
    )
    checksum = b"%06o\x00" % sum(head)
    return head[:148] + checksum + head[155:]


def header(
    name: str, kind: bytes, mode: int, uid: int, gid: int, size: int, mtime: int, linkname: str = ""
) -> bytes:
    """The header block(s) of one member, PAX format: a PAX header first when a name is long or
    not ASCII, or a number does not fit its field (as ``tarfile``'s PAX_FORMAT writes)."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
    pax: list[tuple[bytes, bytes]] = []
    binary = False
    for key, text, raw in ((b"path", name, raw_name), (b"linkpath", linkname, raw_link)):
        if len(raw) > 100 or not raw.isascii():
            pax.append((key, raw))
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                binary = True
    numbers = {"uid": (uid, 8), "gid": (gid, 8), "size": (size, 12), "mtime": (mtime, 12)}
    fitted: dict[str, int] = {}
    for field, (value, width) in numbers.items():
        if 0 <= value < 8 ** (width - 1):
            fitted[field] = value
        else:
            pax.append((field.encode("ascii"), str(value).encode("ascii")))
            fitted[field] = 0
    ustar_name = name.encode("ascii", "replace") if not raw_name.isascii() else raw_name
    ustar_link = linkname.encode("ascii", "replace") if not raw_link.isascii() else raw_link
    own = _block(
        ustar_name, kind, mode, fitted["uid"], fitted["gid"], fitted["size"], fitted["mtime"], ustar_link
    )
    if not pax:
        return own
    records = b"".join(_pax_record(k, v) for k, v in ([(b"hdrcharset", b"BINARY")] if binary else []) + pax)
    ext = _block(b"././@PaxHeader", _PAX, 0o644, 0, 0, len(records), 0, b"")
    return ext + records + bytes(-len(records) % BLOCK) + own


def trailer(written: int) -> bytes:
    """The end of an archive of ``written`` bytes so far: two zero blocks, padded to a record."""
    end = written + 2 * BLOCK
    return bytes(2 * BLOCK + (-end % RECORD))
