"""A session's life in the core: what it is (``session.py``), what it carries between calls
(``state.py``), the one owner of every session's life (``registry.py``), its two clocks
(``clock.py``) and their work — expiry, renewal, pause and resume (``expiry.py``) — over one heap of
deadlines for every session (``deadlines.py``)."""
