"""``unescape`` inverts list_dir's escaping of names, and cannot make a path separator or '..'."""

from __future__ import annotations

import random

import pytest

from dispatcher.core.text.visible import unescape, visible


@pytest.mark.parametrize(
    "name",
    ["bad\udcff.txt", "back\\slash", "lit\\udcff", "new\nline", "\u202eevil", "tab\there", "\\", "plain.py"],
)
def test_unescape_inverts_the_listing(name: str) -> None:
    assert unescape(visible(name, escape_backslash=True)) == name


def test_unescape_inverts_the_listing_for_random_names() -> None:
    rng = random.Random(8)
    alphabet = ["\\", "u", "d", "c", "f", "x", "2", "0", "U", "n", "\udcff", "\n", "\x1b", "\u202e", "é", "a"]
    for _ in range(5000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert unescape(visible(name, escape_backslash=True)) == name


@pytest.mark.parametrize("text", ["a\\x2fb", "\\x2e\\x2e", "\\u002f", "C:\\foo", "a\\qb", "plain"])
def test_only_what_a_listing_escapes_is_unescaped(text: str) -> None:
    assert unescape(text) == text
