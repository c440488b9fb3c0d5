"""The gRPC contract's messages <-> the core's domain types, used by both the server and the clients.

``convert``: tools, tool uses and results, events, sessions; ``convert_policy``: a session's mode,
capabilities and plan. Imports only ``dispatcher.core`` and the generated ``dispatcher.v1``.
"""
