"""Enough of PNG to read a browser's screenshot: 8-bit RGB or RGBA, not interlaced (what Chromium's
``Page.captureScreenshot`` writes), as rows of (r, g, b) pixels."""

from __future__ import annotations

import struct
import zlib

Pixel = tuple[int, int, int]


def decode(data: bytes) -> list[list[Pixel]]:
    """The pixels of a PNG, row by row."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, bytearray(), b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * channels
    rows: list[list[Pixel]] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append([(line[x], line[x + 1], line[x + 2]) for x in range(0, stride, channels)])
        previous = line
    return rows
