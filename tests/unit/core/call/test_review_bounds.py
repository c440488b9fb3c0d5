"""A staged change's diff stays bounded: difflib grows far faster than linearly on crafted input."""

from __future__ import annotations

from dispatcher.core.call.review import DIFF_MAX_LINES
from dispatcher.core.call.review import unified_diff as _diff


def test_a_crafted_long_change_is_named_not_diffed() -> None:
    n = DIFF_MAX_LINES * 4  # at this size difflib took over a minute on these two sides
    before = "".join(f"{i % 150}\n" for i in range(n)).encode()
    after = "".join(f"{(i * 7) % 150}\n" for i in range(n)).encode()
    shown = _diff("big.txt", before, after)
    assert shown == (
        f"File big.txt: {n:,} lines -> {n:,} lines; too long to diff (over {DIFF_MAX_LINES:,} lines)\n"
    )


def test_a_change_within_the_bound_is_a_unified_diff() -> None:
    shown = _diff("f.txt", b"a\nb\n", b"a\nc\n")
    assert shown.splitlines()[:2] == ["--- a/f.txt", "+++ b/f.txt"]
    assert "-b" in shown.splitlines() and "+c" in shown.splitlines()
