"""The in-sandbox agent, a stdlib-only package (see ``agent.py``); ``protocol.py`` is the schema the
host imports, alone. Nothing is imported here, so importing the protocol loads nothing else."""
