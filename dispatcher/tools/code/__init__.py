"""``run_code``: a stateful code interpreter per session (issue 34), its workers run as processes
of the session's table (``contexts.py``)."""

from dispatcher.tools.code.tool import RunCodeTool

__all__ = ["RunCodeTool"]
