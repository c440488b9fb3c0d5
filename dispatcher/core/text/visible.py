"""Make text safe to show a human: control, format (bidi) and separator characters become escapes.

What a person approves or reads in a listing must be what is there. A terminal interprets ``\\r``,
ESC sequences and bidi overrides (U+202E) so that the text it draws is not the text it was given;
these functions replace every such character with a visible escape (``\\r``, ``\\x1b``,
``\\u202e``) and never drop or shorten anything.
"""

from __future__ import annotations

import functools
import re
import unicodedata

# Cc: C0/C1 controls and DEL; Cf: format characters, among them the bidi embeddings, overrides and
# isolates and the zero-width ones; Cs: lone surrogates (names that were not valid UTF-8);
# Zl/Zp: line and paragraph separators, which some terminals and editors break lines on.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


@functools.cache
def _pattern(keep: str, escape_backslash: bool) -> re.Pattern[str]:
    codes = [
        cp
        for cp in range(0x110000)
        if unicodedata.category(chr(cp)) in _INVISIBLE_CATEGORIES and chr(cp) not in keep
    ]
    if escape_backslash:
        codes.append(ord("\\"))
    # As ranges (about 25 instead of 2,000+ members): the regex engine then tests each character
    # against a short list, about ten times faster on long text than against every member.
    ranges: list[list[int]] = []
    for cp in sorted(codes):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    body = "".join(
        re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges
    )
    return re.compile(f"[{body}]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    short = _SHORT.get(ch)
    if short is not None:
        return short
    cp = ord(ch)
    return f"\\x{cp:02x}" if cp < 0x100 else (f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")


def visible(text: str, *, keep_newlines: bool = False, escape_backslash: bool = False) -> str:
    """``text`` with every invisible or display-changing character escaped.

    ``keep_newlines`` leaves ``\\n`` and ``\\t`` as they are (a multi-line command stays readable);
    ``escape_backslash`` doubles backslashes so an escape can never be forged (one name, one line).
    """
    return _pattern("\n\t" if keep_newlines else "", escape_backslash).sub(_escape, text)


def count_escaped(text: str, *, keep_newlines: bool = False) -> int:
    """How many characters ``visible`` would escape (0: the text is shown exactly as it is)."""
    return len(_pattern("\n\t" if keep_newlines else "", False).findall(text))


_ESCAPE_RE = re.compile(r"\\(\\|[nrt]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")
_UNSHORT = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


def _unescape(match: re.Match[str]) -> str:
    body = match.group(1)
    ch = _UNSHORT.get(body) or chr(min(int(body[1:], 16), 0x10FFFF))
    # Only what ``visible`` escapes is unescaped: `\x2f` stays four characters, never a '/',
    # so decoding can neither add a path component nor a '..'.
    if ch == "\\" or unicodedata.category(ch) in _INVISIBLE_CATEGORIES:
        return ch
    return match.group(0)


def unescape(text: str) -> str:
    """The inverse of ``visible(..., escape_backslash=True)``: a name as a listing showed it,
    back to the name itself (``\\udcff`` to the lone surrogate of the byte 0xff, ``\\\\`` to ``\\``).

    Other backslashes are kept, so text without escapes, or with a lone ``\\`` that starts none,
    is returned as it is; ``unescape(visible(s, escape_backslash=True)) == s`` for every ``s``.
    """
    if "\\" not in text:
        return text
    return _ESCAPE_RE.sub(_unescape, text)
