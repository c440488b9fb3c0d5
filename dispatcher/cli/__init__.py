"""The ``dispatcher`` command: ``serve`` the service, and client verbs for people and scripts.

Exit codes (documented in ``dispatcher --help``):

    0  success                         4  UNAUTHENTICATED (no or bad token)
    1  the tool call failed (is_error), 5  NOT_FOUND (unknown session / request)
       or an answer came too late,     6  INVALID_ARGUMENT
       or a staged change was refused
    2  usage or configuration error    7  RESOURCE_EXHAUSTED (quota, message size)
    3  server unreachable/unavailable  8  any other request error
  130  interrupted (Ctrl-C); the call's tools are cancelled
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence

from dispatcher.cli import config as cli_config
from dispatcher.cli import lifecycle as cli_lifecycle
from dispatcher.cli import mcp as cli_mcp
from dispatcher.cli import ports as cli_ports
from dispatcher.cli import processes as cli_processes
from dispatcher.cli import session as cli_session
from dispatcher.cli import snapshots as cli_snapshots
from dispatcher.cli import staged as cli_staged
from dispatcher.cli import trees as cli_trees
from dispatcher.cli import usage as cli_usage
from dispatcher.cli.output import (
    EXIT_BY_CODE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OTHER_REQUEST_ERROR,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    CallPrinter,
    json_line,
)
from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.config import ENV_HOME, ENV_LISTEN, default_target
from dispatcher.core.approval.broker import Decision
from dispatcher.core.errors import ConfigError
from dispatcher.core.events.bus import TOOL_CONFIRMATION_REQUESTED, Event
from dispatcher.core.events.payloads import ToolConfirmationRequested
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.wire.convert import SessionInfo

CLI_LABEL = "dispatcher.cli"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dispatcher`` console script."""
    args = _parser().parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except ConfigError as exc:
        print(f"dispatcher: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SandboxError as exc:
        print(f"dispatcher: sandbox unavailable: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RequestFailed as exc:
        print(f"dispatcher: {exc.code}: {exc.details}", file=sys.stderr)
        return EXIT_BY_CODE.get(exc.code, EXIT_OTHER_REQUEST_ERROR)
    except KeyboardInterrupt:
        print("dispatcher: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


# --- serve -----------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from dispatcher.server.persistence.errors import StateError

    try:
        return _run_server(args)
    except StateError as exc:  # the home is held by another server, or its state.db is unusable
        print(f"dispatcher: cannot start: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_server(args: argparse.Namespace) -> int:
    from dispatcher.config.load import ensure_default_tenant, load_config
    from dispatcher.server.allocator import bound_allocator
    from dispatcher.server.app import build_server, serve_until_signalled
    from dispatcher.server.observability.logs import configure_logging

    bound_allocator()  # before any thread of the server allocates

    config = load_config(args.config, listen=args.listen, home=args.home)
    if args.metrics_listen is not None:
        from dispatcher.config_base import check_listen

        listen = check_listen(args.metrics_listen, "--metrics-listen")
        config = dataclasses.replace(
            config, observe=dataclasses.replace(config.observe, metrics_listen=listen)
        )
    config, generated = ensure_default_tenant(config)
    configure_logging(args.log_format or config.log_format, config.log_level)

    def ready(port: int) -> None:
        host = config.listen.rpartition(":")[0]
        where = f"{host}:{port}"
        token_note = f"; token in {config.token_path}" if config.token_path.exists() else ""
        fresh = " (new token generated)" if generated else ""
        print(f"dispatcher: serving on {where}{token_note}{fresh}", file=sys.stderr, flush=True)

    async def run() -> None:
        # grpc.aio binds the server to the running loop: build it inside.
        server = build_server(config)

        def on_ready(port: int) -> None:
            ready(port)
            metrics_port = server.observability.metrics_port
            if metrics_port and config.observe.metrics_listen:
                host = config.observe.metrics_listen.rpartition(":")[0]
                print(
                    f"dispatcher: metrics on http://{host}:{metrics_port}/metrics",
                    file=sys.stderr,
                    flush=True,
                )

        await serve_until_signalled(server, on_ready=on_ready)

    asyncio.run(run())
    return EXIT_OK


# --- client verbs ------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> DispatcherClient:
    return DispatcherClient(
        args.server or default_target(),
        home=args.home,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


def _async_client(args: argparse.Namespace) -> AsyncDispatcherClient:
    return AsyncDispatcherClient(
        args.server or default_target(),
        home=args.home,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


def _cli_session(client: DispatcherClient, args: argparse.Namespace) -> SessionInfo:
    """``--session`` if given; else the CLI's session on ``--workspace`` (reused, or created)."""
    if args.session:
        return client.get_session(args.session)
    workspace = args.workspace or "default"
    for info in client.list_sessions():
        if info.labels.get(CLI_LABEL) == "1" and info.workspace == workspace:
            return info
    return client.create_session(workspace, labels={CLI_LABEL: "1"})


def _tools(args: argparse.Namespace) -> int:
    if args.format:
        with _client(args) as client:
            definitions = client.tools_for(_cli_session(client, args), args.format)
        print(json.dumps(definitions, indent=2, ensure_ascii=False))
        return EXIT_OK
    with _client(args) as client:
        session = _cli_session(client, args)
        tools = client.list_tools(session.session_id)
    if args.json:
        for t in tools:
            json_line(
                {
                    "name": t.name,
                    "side_effect": str(t.side_effect),
                    "always_prompt": t.always_prompt,
                    "description": t.description,
                    "input_schema": t.input_schema,
                }
            )
    else:
        width = max((len(t.name) for t in tools), default=0)
        for t in tools:
            first = t.description.strip().splitlines()[0] if t.description.strip() else ""
            asks = "  [always asks]" if t.always_prompt else ""
            print(f"{t.name:<{width}}  {t.side_effect!s:<8}  {first}{asks}")
    return EXIT_OK


def _sessions(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sessions = client.list_sessions()
    now = time.time()
    for s in sessions:
        if args.json:
            json_line({**cli_session.session_dict(s), **cli_lifecycle.lifecycle_dict(s, now)})
        else:
            print(cli_lifecycle.session_line(s, now))
    return EXIT_OK


def _call(args: argparse.Namespace) -> int:
    try:
        tool_input = json.loads(args.input)
    except ValueError as exc:
        print(f"dispatcher: JSON argument is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with _client(args) as client:
        session = _cli_session(client, args)
        if not args.json:
            print(f"session {session.session_id} ({session.workspace})", file=sys.stderr)
        block = ToolUseBlock(args.id or f"tu_cli_{os.getpid()}", args.tool, tool_input)
        printer = CallPrinter(args.json, sys.stdout, sys.stderr)
        result: ToolResultBlock | None = None
        for item in client.dispatch(session.session_id, [block], turn_id=args.turn or ""):
            if isinstance(item, ToolResultBlock):
                result = item
                printer.result(item)
                continue
            printer.event(item)
            if item.type == TOOL_CONFIRMATION_REQUESTED:
                _answer(client, session.session_id, item, args)
    if result is None:
        print("dispatcher: the stream ended without a result", file=sys.stderr)
        return EXIT_OTHER_REQUEST_ERROR
    return EXIT_TOOL_ERROR if result.is_error else EXIT_OK


def _answer(client: DispatcherClient, session_id: str, event: Event, args: argparse.Namespace) -> None:
    """Answer a confirmation: ``--yes``, or a y/n prompt on a terminal; otherwise leave it to others."""
    p = event.payload
    if not isinstance(p, ToolConfirmationRequested):
        return
    request_id = p.request_id
    if args.yes:
        decision = Decision.ALLOW
    elif sys.stdin.isatty() and not args.json:
        reply = input(f"  allow {p.tool_name}? [y/N] ").strip().lower()
        decision = Decision.ALLOW if reply in ("y", "yes") else Decision.DENY
    else:
        # Said at once: otherwise a script sees nothing until the confirmation timeout ends the call.
        # The call keeps waiting, since a human may answer from another terminal.
        why = "--json output" if args.json else "stdin is not a terminal"
        print(
            f"  nobody can answer here ({why}): the call waits for an answer from another terminal, "
            f"`dispatcher approve {session_id} {request_id}` (or deny), until the server's "
            "confirmation timeout (dispatcher.confirmation_timeout, 300 s by default); "
            "run it with --yes to approve its requests here",
            file=sys.stderr,
            flush=True,
        )
        return
    applied, winner = client.resolve_confirmation(session_id, request_id, decision)
    if not applied and not args.json:
        print(f"  another client answered first: {winner}", file=sys.stderr)


def _watch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        printer = CallPrinter(args.json, sys.stdout, sys.stdout)
        for event in client.watch(args.session_id, after_seq=args.after_seq):
            printer.event(event, watching=True)
    return EXIT_OK


def _resolve(args: argparse.Namespace) -> int:
    decision = Decision.ALLOW if args.verb == "approve" else Decision.DENY
    if args.request_id == "all":  # a batch: every pending request of the session
        with _client(args) as client:
            ids = client.resolve_confirmations(args.session_id, decision)
        print(
            json.dumps({"applied": ids, "decision": str(decision)})
            if args.json
            else f"{decision}: {len(ids)}"
        )
        return EXIT_OK
    remember = getattr(args, "remember", False)
    with _client(args) as client:
        answer = client.answer(args.session_id, args.request_id, decision, remember=remember)
    applied, winner = answer.applied, answer.decision
    if args.json:
        json_line({"applied": applied, "decision": str(winner), "remembered": answer.remembered})
    else:
        print(f"{'applied' if applied else 'not applied (answered before)'}: {winner}")
        if remember and not answer.remembered:  # say so rather than let --remember seem to have worked
            why = "" if not applied else ": this tool always asks, its answers are never remembered"
            print(f"nothing was remembered{why}", file=sys.stderr)
        elif answer.remembered:
            # An egress prompt remembers its host, a tool's prompt its tool: one line fits both.
            print(
                "remembered for the rest of the session (this tool, or for an egress prompt this host)",
                file=sys.stderr,
            )
    return EXIT_OK if applied else EXIT_TOOL_ERROR


# --- arguments ---------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatcher",
        description="Sandboxed tool dispatcher for LLM agents, served over gRPC.",
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    serve = verbs.add_parser("serve", help="run the gRPC service until SIGTERM/SIGINT")
    serve.add_argument("--config", metavar="FILE", help="YAML config (default: embedded defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", help=f"overrides ${ENV_LISTEN} and the config")
    serve.add_argument("--home", metavar="DIR", help=f"state directory; overrides ${ENV_HOME} and the config")
    serve.add_argument("--log-format", choices=("json", "text"), help="overrides log.format")
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics here; overrides metrics.listen",
    )
    serve.set_defaults(func=_serve)

    client_opts = argparse.ArgumentParser(add_help=False)
    client_opts.add_argument(
        "--server", metavar="HOST:PORT", help=f"default: ${ENV_LISTEN} or 127.0.0.1:50051"
    )
    client_opts.add_argument(
        "--home", metavar="DIR", help="where to find the token (default: $DISPATCHER_HOME)"
    )
    client_opts.add_argument("--json", action="store_true", help="one JSON object per line, for scripts")
    client_opts.add_argument(
        "--tls-ca", metavar="FILE", help="connect over TLS, trusting this CA (default: $DISPATCHER_TLS_CA)"
    )
    client_opts.add_argument("--tls-cert", metavar="FILE", help="client certificate, for mutual TLS")
    client_opts.add_argument("--tls-key", metavar="FILE", help="the client certificate's private key")
    session_opts = argparse.ArgumentParser(add_help=False)
    session_opts.add_argument("--session", metavar="ID", help="use this session")
    session_opts.add_argument(
        "--workspace",
        metavar="NAME",
        help="without --session: the CLI's session on this workspace (default: default)",
    )

    tools = verbs.add_parser(
        "tools", parents=[client_opts, session_opts], help="list the tools a session may call"
    )
    tools.add_argument(
        "--format",
        choices=("openai", "anthropic", "mcp"),
        help="print them as one JSON array in this provider's shape, to pass as that API's tools",
    )
    tools.set_defaults(func=_tools)
    sessions = verbs.add_parser(
        "sessions",
        parents=[client_opts],
        help="list your sessions: state, expiry, idle time, pending confirmations, plan steps",
    )
    sessions.set_defaults(func=_sessions)

    call = verbs.add_parser(
        "call", parents=[client_opts, session_opts], help="call one tool, printing its events as they come"
    )
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("input", metavar="JSON", help='the tool input, e.g. \'{"path": "README.md"}\'')
    call.add_argument("--id", metavar="TOOL_USE_ID", help="tool_use id (default: generated)")
    call.add_argument("--turn", metavar="TURN_ID", help="turn id for the events")
    call.add_argument("--yes", "-y", action="store_true", help="approve this call's confirmation requests")
    call.set_defaults(func=_call)

    watch = verbs.add_parser("watch", parents=[client_opts], help="follow every event of a session")
    watch.add_argument("session_id", metavar="SESSION")
    watch.add_argument(
        "--after-seq", type=int, default=0, metavar="N", help="replay events after N (default 0)"
    )
    watch.set_defaults(func=_watch)

    cli_trees.add_verbs(verbs, client_opts, _client)

    for verb, text in (("approve", "allow"), ("deny", "deny")):
        p = verbs.add_parser(verb, parents=[client_opts], help=f"{text} a pending confirmation request")
        p.add_argument("session_id", metavar="SESSION")
        p.add_argument("request_id", metavar="REQUEST", help="a request id, or all: every pending one")
        if verb == "approve":
            p.add_argument(
                "--remember", action="store_true", help="approve this tool for the rest of the session"
            )
        p.set_defaults(func=_resolve)
    cli_session.add_verbs(verbs, client_opts, _client)
    cli_lifecycle.add_verbs(verbs, client_opts, _client)
    cli_staged.add_verbs(verbs, client_opts, _client)
    cli_processes.add_verbs(verbs, client_opts, _client)
    cli_usage.add_verbs(verbs, client_opts, _client)
    cli_snapshots.add_verbs(verbs, client_opts, _client)
    cli_ports.add_verbs(verbs, client_opts, _async_client, _client)
    cli_config.add_verbs(verbs)
    cli_mcp.add_verbs(verbs, client_opts)
    return parser
