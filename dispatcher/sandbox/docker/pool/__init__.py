"""The warm pool: containers made ahead of sessions, each adopted by one session for good.

``warm_pool`` (``WarmPool``: reserve, take, release, the rules it keeps), ``ledger`` (who holds each
container), ``filler`` (the background loop that makes them), ``adopt`` (a session's workspace
mounted into one through its slot, confirmed by its agent), ``shares`` (how the size is shared among
tenants and users).
"""
