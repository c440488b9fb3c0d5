"""Text as the core shows and bounds it: safe for a human to read (``visible.py``), secrets
redacted (``redact.py``), a tool input shown whole to an approver and bounded to logs
(``display.py``), long text kept head and tail (``truncate.py``), and results fitted under a byte
budget (``result_size.py``)."""
