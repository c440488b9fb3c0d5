"""Label selectors as the API server parses them from ``?labelSelector=``.

Equality-based (``a=b``, ``a==b``, ``a!=b``) and set-based (``a in (x,y)``, ``a notin (x)``, ``a``,
``!a``) requirements, comma-separated, all of which must hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Labels = Mapping[str, str]

_SET = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


class SelectorError(ValueError):
    """The selector does not parse; the server answers 400 BadRequest."""


@dataclass(frozen=True)
class Requirement:
    key: str
    test: Callable[[str | None], bool]

    def matches(self, labels: Labels) -> bool:
        return self.test(labels.get(self.key))


def _split(text: str) -> list[str]:
    """Split on the commas that are not inside a parenthesised value set."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Requirement:
    if m := _SET.match(text):
        key, op, raw = m.groups()
        values = frozenset(v.strip() for v in raw.split(",") if v.strip())
        if op == "in":
            return Requirement(key, lambda v: v is not None and v in values)
        return Requirement(key, lambda v: v is None or v not in values)
    if m := _EQ.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return Requirement(key, lambda v: v != value)
        return Requirement(key, lambda v: v == value)
    if m := _EXISTS.match(text):
        negate, key = m.groups()
        if negate:
            return Requirement(key, lambda v: v is None)
        return Requirement(key, lambda v: v is not None)
    raise SelectorError(f"unable to parse requirement: {text.strip()!r}")


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Labels) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def parse_selector(text: str | None) -> Selector:
    """Parse ``text`` (empty or None selects everything).

    Raises:
        SelectorError: a requirement does not parse.
    """
    if not text:
        return Selector(())
    return Selector(tuple(_requirement(part) for part in _split(text)))
