"""A stand-in Kubernetes API server for tests: the subset the Kubernetes sandbox backend uses.

No real API server can run on these machines, so this one serves pods, persistentvolumeclaims,
configmaps and networkpolicies in namespaces (create, get, list with label selectors, watch, delete), ``pods/attach``
over WebSocket (``v4.channel.k8s.io`` / ``v5.channel.k8s.io``) and ``Status`` objects for errors,
and runs each Pod as a real local Docker container with the Pod's settings translated
(``podspec.py``). A real ``kubectl`` is pointed at it in ``tests/kubernetes`` so it is held to a real
client's expectations, not only ours.

What it does not model: scheduling and nodes (every Pod "runs" on this host at once), node pressure
and eviction, real storage (a PVC is a host directory, no storage class, size or access mode is
enforced), NetworkPolicy enforcement (every Pod has Docker's network ``none``, which is stricter
than any policy), ephemeral-storage limits, RBAC (one bearer token may do everything), admission
webhooks, PATCH/PUT, and Services.
"""

from tests.kube_standin.server import StandIn, write_kubeconfig

__all__ = ["StandIn", "write_kubeconfig"]
