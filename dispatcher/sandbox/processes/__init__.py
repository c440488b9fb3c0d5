"""A session's background processes on the host: the agent's process table (``agent/table.py``)
as ``core.process_api`` states it. ``calls.py`` maps the agent's messages and refusals to the core's
types (``AgentChannel`` uses it); ``control.py`` is the ``ProcessControl`` every agent-backed
sandbox returns, over how that sandbox reaches its agent (``ProcessHost``)."""
