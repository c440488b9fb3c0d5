"""The Kubernetes host of the container sandbox: one Pod per session, the agent attached over the
API server.

``backend`` (the provider: Pods launched, re-adopted, reaped; the per-session sandbox, its guards
and the idle reaper are ``dispatcher.sandbox.container``'s, which it hosts through ``ContainerHost``),
``manifests`` (the Pod, PVC and NetworkPolicy it creates, pure: ``config-check --show-pod`` prints
them), ``pods`` (reading a Pod: running, age, re-adoptable), ``api`` (the few API calls it makes,
through ``kubernetes_asyncio``), ``attach`` (the ``pods/attach`` WebSocket as the agent's byte
stream), ``ca`` (a tenant's egress CA bundle as a ConfigMap the Pods mount). Its config section,
``sandbox.kubernetes:``, is ``container/kubernetes_config.py`` (the config package imports no backend).
"""
