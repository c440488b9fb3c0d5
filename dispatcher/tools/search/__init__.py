"""``glob`` and ``grep``: read-only searches of the workspace, run in the sandbox (``program.py``)."""

from __future__ import annotations

from dispatcher.tools.search.glob import GlobTool
from dispatcher.tools.search.grep import GrepTool

__all__ = ["GlobTool", "GrepTool"]
