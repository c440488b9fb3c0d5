"""MCP servers as tools (spec 000 phase 3, spec 004): ``mcp_servers:`` in the config, each server's
tools registered as ``mcp_<server>_<tool>`` and proxied through the normal pipeline.

``config`` imports nothing of the MCP SDK, so the config loader stays light; the rest does.
"""
