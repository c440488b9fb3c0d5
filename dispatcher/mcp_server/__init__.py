"""The dispatcher as an MCP server: a session's tools for any MCP host, approvals as elicitation.

A gateway in front of the gRPC service, never beside it: every MCP request becomes the gRPC calls a
client would make (``ListTools``, ``Dispatch``, ``ResolveConfirmation``) with the caller's token, so
policy, quotas, audit and "first answer wins" are the server's and nothing is decided twice.
``dispatcher mcp`` serves it over stdio (``stdio.py``); the server's ``mcp_endpoint`` serves it over
streamable HTTP (``http.py``). ``shapes.py`` converts, ``approval.py`` asks, ``bridge.py`` runs.
"""
