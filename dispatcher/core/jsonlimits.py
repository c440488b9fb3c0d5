"""Bounds on the shape of a tool input: nesting depth and number of JSON values.

A tenant controls every byte of ``input_json``. Python's json parser, jsonschema, redaction and
protobuf all recurse on nesting, and each costs per value: 900 levels parse but break whatever
walks the result next, and 4 MB of ``[[],[],...]`` costs half a second to parse alone. So the
shape is measured on the raw text first, at C speed (bytes methods only, no per-character Python
loop), and an input outside the bounds is refused before anything recursive or per-value runs.

Numbers JSON cannot carry (``NaN``, ``Infinity``, a literal past a float's range such as ``1e400``),
which Python's parser accepts, are refused too: NaN passes every ``maximum`` of a schema (every
comparison with it is false), so a tool's bounded ``timeout_seconds`` would run unbounded.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

MAX_DEPTH: Final = 64
"""Deepest nesting of arrays/objects accepted in a tool input."""
MAX_VALUES: Final = 10_000
"""Most JSON values (strings, numbers, literals, arrays, objects; keys count) in a tool input."""

_KEEP = b'"[]{},'
_DELETE = bytes(b for b in range(256) if b not in _KEEP)
_BRACKETS = bytes.maketrans(b"{}", b"[]")


class InputShapeError(ValueError):
    """The input is nested too deeply or has too many values (a validation error, not a crash)."""


def _structure(raw: str) -> bytes:
    """The structural characters of ``raw`` that lie outside JSON strings, in order.

    Exact for valid JSON and for the valid prefix of invalid JSON, which is all a parser reads.

    Raises:
        InputShapeError: more values than MAX_VALUES.
    """
    data = raw.encode("utf-8", "surrogatepass")  # multi-byte sequences never contain ASCII bytes
    if b"\\" in data:
        # In a valid string every backslash starts an escape: drop escaped backslashes, then
        # escaped quotes, and every '"' left is a string boundary.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = data.translate(None, _DELETE)
    strings = data.count(b'"') // 2
    if strings > MAX_VALUES:
        raise InputShapeError(f"it has more than {MAX_VALUES:,} JSON values")
    outside = b"".join(data.split(b'"')[::2]) if strings else data
    values = strings + outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1
    if values > MAX_VALUES:
        raise InputShapeError(f"it has more than {MAX_VALUES:,} JSON values")
    return outside


def loads(raw: str) -> Any:
    """``json.loads`` for a tool input, refusing a shape outside MAX_DEPTH / MAX_VALUES first.

    Raises:
        InputShapeError: too deep or too many values.
        ValueError: not valid JSON (json.JSONDecodeError).
    """
    brackets = _structure(raw).translate(_BRACKETS, b",")
    if len(brackets) > 2 * MAX_VALUES:  # more closing than opening brackets: not JSON
        raise ValueError("unbalanced brackets")
    depth = 0
    for byte in brackets:  # at most 2 * MAX_VALUES iterations
        depth += 1 if byte == 0x5B else -1
        if depth > MAX_DEPTH:
            raise InputShapeError(f"it is nested deeper than {MAX_DEPTH} levels")
    return _DECODER.decode(raw)


def _not_finite(literal: str) -> float:
    raise ValueError(f"{literal} is not a finite number (JSON has none)")


def _finite_float(literal: str) -> float:
    """A float literal's value (called only for literals with a fraction or an exponent)."""
    value = float(literal)
    if not math.isfinite(value):
        _not_finite(literal)
    return value


_DECODER = json.JSONDecoder(parse_constant=_not_finite, parse_float=_finite_float)
"""Made once: ``json.loads`` with hooks would build a decoder per call."""


def shape_problem(value: Any) -> str | None:
    """Why an already-built input value is outside the bounds, or None (iterative, stops early).

    For inputs that did not come through ``loads`` (in-process callers), so that nothing after
    validation ever recurses deeper than MAX_DEPTH or walks more than MAX_VALUES values.
    """
    count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            return f"it has more than {MAX_VALUES:,} JSON values"
        if isinstance(node, dict):
            children: Any = node.values()
            count += len(node)  # keys are values too
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > MAX_DEPTH:
            return f"it is nested deeper than {MAX_DEPTH} levels"
        if count + len(children) > MAX_VALUES:
            return f"it has more than {MAX_VALUES:,} JSON values"
        stack.extend((child, depth + 1) for child in children)
    return None
