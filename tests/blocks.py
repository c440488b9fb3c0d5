"""Reading a tool result's content in tests: ``content`` holds text and image blocks, so a test that
reads one block's ``.text`` says first, with a check, that it is a text block."""

from __future__ import annotations

from dispatcher.core.types import TextBlock, ToolResultBlock

__all__ = ["text_at"]


def text_at(result: ToolResultBlock, index: int = 0) -> str:
    """The text of ``result.content[index]``, which must be a text block.

    Raises:
        AssertionError: it is an image block.
    """
    block = result.content[index]
    assert isinstance(block, TextBlock), f"content[{index}] is not text: {block!r}"
    return block.text
