"""What decides whether a call runs before it runs: the approval modes' names (``modes.py``), the
confirmation policy by side-effect class with spec 004's presets (``confirmation_policy.py``), and a
session's broker of questions to a human and their answers (``broker.py``). Applying them to one
call is a step of the call (``core/call/approve.py``)."""
