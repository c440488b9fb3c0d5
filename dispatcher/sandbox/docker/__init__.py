"""The Docker host of the container sandbox: one container per session, the workspace bind-mounted.

``backend`` (the provider: launch, limits, quotas, orphans; what it shares with the Kubernetes host,
the per-session ``ContainerSandbox`` and the idle reaper among it, is ``dispatcher.sandbox.container``),
``launch`` (making one container), ``agent`` (the agent started in it: ``attach``, and ``listener`` for the server's socket),
``fallback`` (``docker exec`` for an image that cannot run the agent), ``stdio`` (a process with its
stdio attached), ``orphans`` (the start-up sweep), ``watch`` (container deaths), ``pool`` (the warm
pool), ``client`` (the Docker API off the event loop), ``stream`` (attached exec streams),
``image_check`` (what an image must have), ``workspace_volume`` (per-tenant quota volumes).
"""
