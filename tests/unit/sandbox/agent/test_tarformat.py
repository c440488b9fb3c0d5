"""The agent's own tar reader and header writer agree with ``tarfile`` (the format's reference
here): same members, same contents, an error where tarfile has one; extended headers are bounded."""

from __future__ import annotations

import io
import os
import random
import tarfile

import pytest

from dispatcher.sandbox.agent.tarformat import (
    MAX_EXTENDED,
    RECORD,
    REGULAR,
    BadMember,
    TarFormatError,
    TarReader,
    header,
    trailer,
)

Seen = tuple[str, list[tuple[str, bytes, int, float, str, bytes]]]
NAMES = ["a", "d/b.txt", "x" * 150 + "/y", "é/ü.txt", "d" * 99, "p/" + "q" * 120, "deep/" * 30 + "f"]


def _body(tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    """A regular member's bytes (extractfile answers None only for other kinds of member)."""
    file = tar.extractfile(m)
    assert file is not None, m
    return file.read()


def via_tarfile(data: bytes) -> Seen:
    seen: list[tuple[str, bytes, int, float, str, bytes]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            for m in tar:
                body = _body(tar, m) if m.isreg() else b""
                if m.isreg() and len(body) < m.size:
                    return "error", seen  # the agent refuses a file cut short
                seen.append((m.name, m.type, m.mode, float(m.mtime), m.linkname, body))
    except tarfile.TarError:
        return "error", seen
    return "ok", seen


def via_reader(data: bytes, step: int) -> Seen:
    pieces = iter([data[i : i + step] for i in range(0, len(data), step)])
    reader = TarReader(lambda: next(pieces, b""))
    seen = []
    try:
        m = reader.next()
        while m is not None:
            body = b"".join(bytes(v) for v in reader.contents()) if m.type in REGULAR else b""
            seen.append((m.name, m.type, m.mode, m.mtime, m.linkname, body))
            m = reader.next()
    except TarFormatError:
        return "error", seen
    return "ok", seen


def random_archive(rng: random.Random) -> bytes:
    buf = io.BytesIO()
    fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i in range(rng.randint(0, 6)):
            info = tarfile.TarInfo(rng.choice(NAMES[:4] if fmt == tarfile.USTAR_FORMAT else NAMES) + str(i))
            info.mtime, info.mode = rng.choice([0, 1_600_000_000]), rng.choice([0o644, 0o4755])
            kind = rng.random()
            if kind < 0.2:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind < 0.35:
                info.type, info.linkname = tarfile.SYMTYPE, rng.choice(NAMES[:2])
                tar.addfile(info)
            else:
                data = os.urandom(rng.choice([0, 1, 511, 512, 513, 5000]))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_reader_agrees_with_tarfile_on_valid_cut_and_damaged_archives() -> None:
    rng = random.Random(7)
    for _ in range(300):
        data = random_archive(rng)
        damage = rng.random()
        if damage < 0.3:
            data = data[: rng.randrange(len(data) + 1)]
        elif damage < 0.5:
            pos = rng.randrange(len(data))
            data = data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]
        expected = via_tarfile(data)
        got = via_reader(data, rng.choice([1, 7, 512, 777, 1 << 20]))
        assert got[0] == expected[0] and got[1] == expected[1][: len(got[1])]
        if got[0] == "ok":
            assert got == expected


def test_extended_headers_are_bounded() -> None:
    info = tarfile.TarInfo("p" * (MAX_EXTENDED + 1))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(TarFormatError, match="extended header"):
        via_reader_raising(buf.getvalue())


def via_reader_raising(data: bytes) -> None:
    pieces = iter([data])
    TarReader(lambda: next(pieces, b"")).next()


@pytest.mark.parametrize(
    ("name", "link"), [("a/b", ""), ("é" * 80, ""), ("l", "x" * 200), ("n\udcff", ""), ("s", "../t")]
)
def test_written_headers_read_back_with_tarfile(name: str, link: str) -> None:
    size = 0 if link else 3
    data = header(name, b"2" if link else b"0", 0o640, 1000, 1001, size, 1_600_000_000, link)
    data += b"abc" + bytes(509) if size else b""
    data += trailer(len(data))
    assert len(data) % RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tar:
        (m,) = tar.getmembers()
        assert (m.name, m.linkname, m.mode, m.mtime, m.uid, m.gid) == (
            name,
            link,
            0o640,
            1_600_000_000,
            1000,
            1001,
        )
        if size:
            assert _body(tar, m) == b"abc"


def test_numbers_past_their_fields_go_in_the_pax_header() -> None:
    data = header("big", b"0", 0o600, 2**40, 0, 0, -5) + trailer(1024)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        (m,) = list(tar)
        assert (m.uid, m.mtime) == (2**40, -5)


def _pax_member(pax: dict[str, str]) -> bytes:
    info = tarfile.TarInfo("d/f.txt")
    info.pax_headers = pax
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    return buf.getvalue()


def _ustar_member(offset: int, field: bytes) -> bytes:
    """One member whose numeric field at ``offset`` is ``field`` (e.g. base-256), checksum mended."""
    block = bytearray(header("d/f.txt", b"0", 0o644, 0, 0, 0, 0))
    block[offset : offset + len(field)] = field
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\x00" % sum(block)
    return bytes(block) + trailer(len(block))


CASES: dict[str, tuple[bytes, str]] = {
    "pax-mtime-huge": (_pax_member({"mtime": "1e300"}), "mtime 1e\\+300 is out of range"),
    "pax-mtime-inf": (_pax_member({"mtime": "-inf"}), "mtime -inf is out of range"),
    "pax-mtime-nan": (_pax_member({"mtime": "nan"}), "PAX mtime is not a number"),
    "pax-mtime-text": (_pax_member({"mtime": "soon"}), "PAX mtime 'soon' is not a number"),
    "pax-size-huge": (_pax_member({"size": "9" * 40}), "PAX size '9{40}' is out of range"),
    "pax-size-spaced": (_pax_member({"size": " 1"}), "PAX size ' 1' is not a whole number"),
    "pax-uid-huge": (_pax_member({"uid": "4294967296"}), "uid 4294967296 is out of range"),
    "pax-gid-negative": (_pax_member({"gid": "-1"}), "PAX gid '-1' is not a whole number"),
    "mode-negative": (_ustar_member(100, b"\xff" * 8), "mode -1 is out of range"),
    "uid-negative": (_ustar_member(108, b"\xff" * 8), "uid -1 is out of range"),
    "gid-huge": (_ustar_member(116, b"\x80" + b"\xff" * 7), "gid 72057594037927935 is out of range"),
    "size-huge": (_ustar_member(124, b"\x80" + b"\xff" * 11), "size 309485009821345068724781055 is out"),
    "mtime-huge": (_ustar_member(136, b"\x80\x01" + bytes(10)), "mtime 1.20893e\\+24 is out of range"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_number_out_of_range_names_its_member(case: str) -> None:
    """Issue 37 item 10: each numeric field of a header has a bound, and the error says which."""
    data, why = CASES[case]
    with pytest.raises(BadMember, match=why) as caught:
        via_reader_raising(data)
    assert caught.value.member == "d/f.txt"
