"""What a sandbox backend needs of the server's egress proxy: where to hand each connection its
sandbox opened, and the CA bundle its commands should trust.

The server implements it (``dispatcher.server.sessions.egress``) and hands it to the sandbox provider
it makes (``ProviderHooks``); the backend's agent transport (``dispatcher.sandbox.tunnels``) calls
``serve`` once per connection.
"""

from __future__ import annotations

from typing import Protocol

from dispatcher.egress.proxy import TunnelStream

__all__ = ["CA_ENV_NAMES", "EgressGate", "ca_env"]

CA_ENV_NAMES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
"""What names a CA bundle for OpenSSL, requests, pip, node and git."""


def ca_env(path: str | None) -> dict[str, str]:
    """The variables that make a sandbox's tools trust the bundle at ``path`` (None: none)."""
    return {name: path for name in CA_ENV_NAMES} if path else {}


class EgressGate(Protocol):
    def ca_bundle(self, tenant_id: str) -> str | None:
        """The host file of CA certificates the tenant's sandboxes trust (``egress.ca_bundle``)."""
        ...

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        """Serve one connection the session's sandbox opened to its proxy, to its end.

        ``tool_use_id``: the call whose process opened it, when the transport could tell.
        """
        ...
