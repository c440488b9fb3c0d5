"""Staged writes of review and audit sessions (spec 004): the changes a session holds off the disk
(``area.py``), the session's files as it sees them with those changes (``files.py``), and a human's
answer that applies or discards them (``apply.py``). Staging one call is a step of the call
(``core/call/review.py``)."""
