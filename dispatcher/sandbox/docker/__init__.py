"""The Docker sandbox backend: one container per session, the workspace bind-mounted.

``backend`` (the provider: launch, limits, idle retirement, orphans), ``sandbox`` (one session's
sandbox over its agent, with the ``docker exec`` fallback in ``fallback``), ``host`` (the narrow
interface a sandbox has to its provider), ``adopt`` (re-adopting containers after a restart),
``client`` (the Docker API off the event loop), ``stream`` and ``stdio`` (attached exec streams),
``config`` (the ``sandbox:`` section), ``image_check`` (what an image must have),
``workspace_volume`` (per-tenant quota volumes).
"""
