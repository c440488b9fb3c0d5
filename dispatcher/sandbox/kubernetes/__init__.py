"""The Kubernetes sandbox backend: one Pod per session, the agent attached over the API server.

``backend`` (the provider: Pods launched, re-adopted, reaped; it reuses the per-session sandbox and
command guard of ``dispatcher.sandbox.docker`` through their ``ContainerHost`` interface),
``manifests`` (the Pod, PVC and NetworkPolicy it creates, pure: ``config-check --show-pod`` prints
them), ``pods`` (reading a Pod: running, age, re-adoptable), ``api`` (the few API calls it makes,
through ``kubernetes_asyncio``), ``attach`` (the ``pods/attach`` WebSocket as the agent's byte
stream), ``ca`` (a tenant's egress CA bundle as a ConfigMap the Pods mount), ``config``
(``sandbox.kubernetes:``).
"""
