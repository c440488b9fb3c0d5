"""What a sandbox image must offer the server, and the errors when it does not: python and the agent,
at this server's protocol version. Both hosts raise these (a Docker image's start-up check, a Pod
whose agent does not answer), and the launch metrics name them.
"""

from __future__ import annotations

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION

HOW_TO_BUILD = (
    "build it FROM dispatcher-sandbox:latest (`make images` builds that one) or follow "
    "sandbox_images/README.md, 'What a custom image must contain'"
)
HOW_TO_GET_AGENT = (
    "`make images` rebuilds the default images with this server's agent; a custom image gets it with "
    "`COPY --from=dispatcher-sandbox:latest /opt/dispatcher/agent.pyz /opt/dispatcher/agent.pyz` "
    "(or `sandbox_images/build.sh agent` writes agent.pyz), owned by root, mode 0444"
)
"""What to do about a missing or outdated agent, since the agent became a zipapp (agent.pyz)."""


class ImageUnusable(SandboxError):
    """The sandbox image cannot serve sessions; the message lists every reason and the fix."""


class AgentVersionMismatch(SandboxError):
    """The agent in the sandbox speaks another protocol version than this server."""


def version_mismatch(image: str, found: int | str) -> AgentVersionMismatch:
    """The error for an agent of another protocol version (or one too old to say)."""
    return AgentVersionMismatch(
        f"the agent in sandbox image {image!r} speaks protocol version {found}, this server speaks "
        f"version {PROTOCOL_VERSION}: rebuild the image with this server's agent ({HOW_TO_GET_AGENT})"
    )
