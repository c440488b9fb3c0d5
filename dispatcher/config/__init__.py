"""The server's one YAML configuration file, its embedded defaults and its overrides.

Precedence, highest first: command-line flags (``--listen``, ``--home``), the environment
(``DISPATCHER_LISTEN``, ``DISPATCHER_HOME``), the file, then the embedded defaults. Everything is
validated when the server starts; every error names the offending key (``tenants[1].quotas.max_sessions:
...``). The sections are pydantic models (``sections.py``, ``policy.py``, ``file.py``; the sandbox's own in
``dispatcher/sandbox/container/config.py`` and ``kubernetes_config.py``, MCP servers' in
``dispatcher/mcp/config.py``; no sandbox backend is imported here), and
``dispatcher config-schema`` prints the JSON Schema they make (``docs/config.schema.json``).

This package's ``__init__`` holds only what clients need (addresses, the token); the server loads
the file with ``dispatcher.config.load.load_config``.

Example::

    listen: 127.0.0.1:50051
    home: ~/.dispatcher
    log: {format: json, level: info}
    server: {max_message_bytes: 4194304, max_request_bytes: 8388608, grace_seconds: 10}
    # UploadFiles / DownloadFiles per request: archive bytes, entries, downloaded content bytes
    # server: {max_upload_bytes: 1073741824, max_upload_files: 100000, max_download_bytes: 1073741824}
    tls: {cert_file: server.pem, key_file: server.key}   # optional; client_ca_file for mutual TLS
    shutdown: {remove_sessions: false}   # true: a graceful stop closes every session (default: kept)
    metrics: {listen: 127.0.0.1:9464}    # Prometheus /metrics (off by default; --metrics-listen)
    tracing: {otlp_endpoint: http://127.0.0.1:4317}   # OTLP spans; needs dispatcher[otel]
    dispatcher: {concurrency: 4, confirmation_timeout: 300, max_write_bytes: 4128768, max_input_bytes: 6291456}
    dispatch: {ordering: concurrent}   # when a Dispatch does not say: sequential | reads_concurrent
    # default_timeout: 60 (NONE/READ/WRITE tools), execute_timeout: 600 (EXECUTE/NETWORK, shell)
    timeouts: {shell: 1800, read_file: 10}         # per tool, seconds (0 < t <= 86400)
    tool_confirmation:            # exactly spec 000's structure
      default: {WRITE: prompt, EXECUTE: prompt}
      per_tool: {git_status: auto}
    sandbox: {backend: docker, image: dispatcher-sandbox:latest}
    tools: ["mypkg.tools:make_grep_tool"]          # custom tool factories, module:callable
    # tools: {custom: [...], shell: {persist: false}}  # the mapping form: built-in tools' settings
    mcp_servers:                                   # stdio MCP servers: tools mcp_<server>_<tool>
      notes: {command: notes-mcp, run: host, side_effect: read}   # see dispatcher/mcp/config.py
    approval_modes: [cautious, manual, review, plan]  # the default; autonomous, audit: only if listed
    tenants:
      - id: acme
        token_sha256: [9f86d0...]                  # sha256 hex of each bearer token
        workspace_root: /srv/dispatcher/acme       # relative: under home (default: home/workspaces/<id>)
        tools: [read_file, list_dir, shell]        # allow-list (omit: every tool)
        fs: [{path: src, mode: rw}, {path: ., mode: r}]
        tool_confirmation: {default: {EXECUTE: deny}}   # laid over the server's policy
        quotas: {max_sessions: 20, max_concurrent_dispatches: 8, max_watch_streams: 8}
        uid: 200500                                # host uid of its sandboxes (omit: allocated)
        gid: 200500                                # host gid (omit: the uid)
        approval_modes: [cautious, review, manual] # modes its sessions may choose (omit: top level's)
    tenant_uids: {start: 200000, count: 100000}    # where tenants without a uid get theirs

Memory is bounded per session and per tenant, in bytes. Defaults: ``quotas: {max_sessions: 100,
max_concurrent_dispatches: 32, max_watch_streams: 32}`` per tenant; per session, at most
``dispatcher.event_history_bytes`` (8 MiB) and 10,000 events of replay history; per Dispatch, at
most 128 tool_uses and 16 MiB of results the client has not read yet (further tool_uses start as
it reads); per result, ``dispatcher.result_budget_bytes`` (images included; default and ceiling:
``server.max_message_bytes`` less 64 KiB), past which the result is cut or, for an image, becomes
an error result for that tool_use alone. Ids, ``turn_id``, tool names and ``request_id`` are at
most 256 characters (longer is INVALID_ARGUMENT).

Without ``tenants:`` there is one tenant, ``default``, whose token is generated on first start
and written to ``<home>/token`` (mode 0600); its workspaces live under ``<home>/workspaces``, and
its sandboxes run as the owner of that directory (so a developer's files stay theirs), as
``sandbox.user`` when the file sets it, and as 1000:1000 when the owner is root (never as root).

With ``tenants:``, every tenant's sandboxes run as that tenant's own host uid and gid, so the
kernel's per-user limits (inotify instances and watches, processes, keys) are the tenant's alone:
``uid:``/``gid:`` when given (distinct per tenant, never 0), else a uid allocated from
``tenant_uids`` on first start (gid = uid), first come first served, and kept in
``<home>/uids.json`` so it survives restarts and reorderings and is never reused for another tenant.
Files a sandbox writes in a tenant's workspaces belong to that uid. A host user reads them as root,
through an ACL (``setfacl -R -m u:alice:rX -m d:u:alice:rX <workspace_root>``; the default entry
covers files made later), or through a group: give the tenant ``gid:`` of a host group the user is
in (files are made group-readable under the usual umask 022).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "DEFAULT_HOME",
    "DEFAULT_LISTEN",
    "ENV_HOME",
    "ENV_LISTEN",
    "ENV_TLS_CA",
    "ENV_TOKEN",
    "TOKEN_FILE",
    "client_token",
    "default_target",
    "hash_token",
]

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_HOME = "~/.dispatcher"
ENV_LISTEN = "DISPATCHER_LISTEN"
ENV_HOME = "DISPATCHER_HOME"
ENV_TOKEN = "DISPATCHER_TOKEN"
ENV_TLS_CA = "DISPATCHER_TLS_CA"
TOKEN_FILE = "token"


def hash_token(token: str) -> str:
    """The sha256 hex digest stored in the config instead of the token itself."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def client_token(home: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The token a client on this machine uses: ``DISPATCHER_TOKEN``, else ``<home>/token``."""
    env = os.environ if env is None else env
    if env.get(ENV_TOKEN):
        return env[ENV_TOKEN].strip()
    base = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser()
    try:
        return (base / TOKEN_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def default_target(env: Mapping[str, str] | None = None) -> str:
    """Where clients connect by default: the server's default listen address."""
    env = os.environ if env is None else env
    return env.get(ENV_LISTEN) or DEFAULT_LISTEN
