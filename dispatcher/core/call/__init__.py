"""One tool call through the ten steps of spec 000 §4 (``pipeline.py``), the state its steps share
(``run_state.py``), the steps that have a module of their own (approval, review, the record and the
result), and the knobs they read (settings, timeouts, how a message's calls are ordered)."""
