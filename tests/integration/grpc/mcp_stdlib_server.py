"""An MCP server on the standard library alone, for the sandbox image (python3, no SDK). Tests
pass its source with ``python3 -c``, so it must stay under 4,096 characters (an arg's limit).

Tools: ``whoami`` (uid, cwd, pid and network interfaces), ``touch``
(writes a file in its cwd) and ``wait`` (blocks until cancelled: on ``notifications/cancelled`` it
writes ``cancelled-<tag>`` in its cwd, which is the session's workspace).
"""

import json
import os
import sys
import threading
from typing import Any

_lock = threading.Lock()
_waits: dict[Any, tuple[threading.Event, str]] = {}  # by request id: (event, tag)

TOOLS = [
    {
        "name": "whoami",
        "description": "Who and where it runs.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "touch",
        "description": "Create a file in its working directory.",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
    {
        "name": "wait",
        "description": "Wait until cancelled.",
        "inputSchema": {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]},
    },
]


def send(message: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def reply(request_id: Any, **body: Any) -> None:
    send({"jsonrpc": "2.0", "id": request_id, **body})


def text_result(request_id: Any, text: str, is_error: bool = False) -> None:
    reply(request_id, result={"content": [{"type": "text", "text": text}], "isError": is_error})


def network() -> str:
    # Read, never tried: no packet leaves, whatever the answer.
    return "interfaces=" + ",".join(sorted(os.listdir("/sys/class/net")))


def call(request_id: Any, name: str, args: dict[str, Any]) -> None:
    if name == "whoami":
        text_result(request_id, f"uid={os.getuid()} cwd={os.getcwd()} pid={os.getpid()} {network()}")
    elif name == "touch":
        with open(args["name"], "w") as fh:
            fh.write("made by the MCP server\n")
        text_result(request_id, "touched")
    elif name == "wait":
        event = threading.Event()
        with _lock:
            _waits[request_id] = (event, args["tag"])
        with open(f"started-{args['tag']}", "w") as fh:
            fh.write(str(os.getpid()))
        event.wait()
    else:
        reply(request_id, error={"code": -32602, "message": f"unknown tool {name}"})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            reply(
                request_id,
                result={
                    "protocolVersion": params.get("protocolVersion"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "stdlib", "version": "1"},
                },
            )
        elif method == "tools/list":
            reply(request_id, result={"tools": TOOLS})
        elif method == "ping":
            reply(request_id, result={})
        elif method == "tools/call":
            threading.Thread(
                target=call, args=(request_id, params["name"], params.get("arguments") or {}), daemon=True
            ).start()
        elif method == "notifications/cancelled":
            with _lock:
                waiting = _waits.pop(params.get("requestId"), None)
            if waiting is not None:
                with open(f"cancelled-{waiting[1]}", "w") as fh:
                    fh.write("cancelled\n")
                waiting[0].set()
        elif request_id is not None:
            reply(request_id, error={"code": -32601, "message": f"no method {method}"})


main()
