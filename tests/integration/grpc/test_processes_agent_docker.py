"""Issue 32's replay, as an agent meets it: a dev server, its tests, its logs, a stop, a server left
running by ``&``, and a shell that remembers ``cd`` and ``export``, all as ``tool_use`` blocks
through a real ``dispatcher serve`` on Docker; and all of it again after a ``kill -9`` of the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from dispatcher.client import DispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import ProcessExited, ProcessStarted
from dispatcher.core.types import ToolResultBlock
from tests.integration.grpc.test_restart_docker import serve as serve
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9, wait_stored
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.docker

APP = """\
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from app\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

print("serving on", sys.argv[1], flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
FETCH = (
    "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/').read().decode())\""
)
TESTS = """\
import unittest, urllib.request

class AppTest(unittest.TestCase):
    def test_root(self):
        self.assertEqual(urllib.request.urlopen("http://127.0.0.1:{port}/").read(), b"hello from app\\n")

unittest.main()
"""


def call(client: DispatcherClient, sid: str, tool: str, **input: Any) -> ToolResultBlock:
    return client.call(sid, tool, input)


def ok(result: ToolResultBlock) -> str:
    text = text_of(result)
    assert not result.is_error, text
    return text


def wait_served(client: DispatcherClient, sid: str, port: int) -> str:
    deadline = time.monotonic() + 30
    while True:
        result = call(client, sid, "shell", command=FETCH.format(port=port))
        if not result.is_error:
            return text_of(result)
        assert time.monotonic() < deadline, text_of(result)
        time.sleep(0.2)


def group_alive(client: DispatcherClient, sid: str, pid: int) -> bool:
    text = ok(call(client, sid, "shell", command=f"ps -o pid= -g {pid} | grep -c . || true"))
    return int(text.strip().splitlines()[-1]) > 0


def replay(client: DispatcherClient, sid: str, port: int) -> None:
    # (written by shell: this server asks before WRITE calls, not before EXECUTE ones)
    ok(call(client, sid, "shell", command=f"cat > app.py <<'EOF'\n{APP}EOF"))
    ok(call(client, sid, "shell", command=f"cat > test_app.py <<'EOF'\n{TESTS.format(port=port)}EOF"))
    # 1. a dev server in the background: the result comes at once, with its id
    started = call(client, sid, "shell", command=f"python3 app.py {port}", background=True)
    ok(started)
    pid_id = started.metadata["process_id"]
    assert pid_id.startswith("p_") and "process_output" in text_of(started)
    # 2. it answers from the next call; 3. the tests pass against it
    assert "hello from app" in wait_served(client, sid, port)
    assert "OK" in text_of(call(client, sid, "shell", command="python3 test_app.py 2>&1"))
    # 4. its output: stdout and stderr (the request log) apart
    out = call(client, sid, "process_output", process_id=pid_id, wait_seconds=2)
    text = ok(out)
    assert "serving on" in text and '"GET / HTTP/1.1" 200' in text
    assert out.metadata["state"] == "running"
    assert out.metadata["stdout_bytes"] > 0 and out.metadata["stderr_bytes"] > 0
    stdout, stderr = text.split("[stderr]", 1)
    assert "serving on" in stdout and "GET /" in stderr
    # 5. stop it: nothing of its group is left
    listed = ok(call(client, sid, "process_list"))
    assert pid_id in listed and "running" in listed
    line = next(ln for ln in listed.splitlines() if ln.startswith(pid_id))
    pgid = int(line.split("pid ", 1)[1].split()[0])
    assert group_alive(client, sid, pgid)
    ok(call(client, sid, "process_stop", process_id=pid_id))
    line = next(ln for ln in ok(call(client, sid, "process_list")).splitlines() if ln.startswith(pid_id))
    assert "running" not in line, line
    assert not group_alive(client, sid, pgid)
    # the session's events said it started and ended (no output in them)
    began: Event | None = None
    for event in client.watch(sid):
        payload = event.payload
        if isinstance(payload, ProcessStarted) and payload.process_id == pid_id:
            began = event
        if isinstance(payload, ProcessExited) and payload.process_id == pid_id:
            assert payload.state == "killed" and payload.signal == 15
            break
    assert began is not None and began.tool_use_id == started.tool_use_id
    # 6. `&` in a foreground call keeps working after the call, and is listed
    left = call(client, sid, "shell", command=f"python3 app.py {port + 1} &")
    assert "left 1 process running" in ok(left)
    assert "hello from app" in wait_served(client, sid, port + 1)
    assert left.metadata["left_processes"][0] in ok(call(client, sid, "process_list"))
    # 7. cd and export persist
    ok(call(client, sid, "shell", command="mkdir -p sub && cd sub && pwd"))
    assert ok(call(client, sid, "shell", command="pwd")).strip() == "/workspace/sub"
    ok(call(client, sid, "shell", command="export FOO=bar"))
    assert ok(call(client, sid, "shell", command="echo $FOO")).strip() == "bar"
    ok(call(client, sid, "shell", command="true", reset=True))
    assert ok(call(client, sid, "shell", command="pwd; echo x${FOO}x")).split() == ["/workspace", "xx"]


def test_the_agent_replay_works_and_works_again_after_a_kill_9(
    serve: Callable[..., ServeProcess],
) -> None:
    server = serve()
    with server.client() as client:
        sid = client.create_session("proj").session_id
        replay(client, sid, 8000)
        # a process left running across the restart, and the shell's memory
        ok(call(client, sid, "shell", command="cd sub && export KEPT=yes"))
        kept = call(client, sid, "shell", command="sleep 600", background=True)
        ok(kept)
    # the shell's memory is written behind the calls (as events are): kill once it is stored
    wait_stored(
        server.home,
        "SELECT processes FROM sessions WHERE session_id = ?",
        (sid,),
        lambda row: row is not None and '"KEPT"' in row[0],
    )
    kill9(server)
    server = serve()
    with server.client() as client:
        assert ok(call(client, sid, "shell", command="pwd; echo $KEPT")).split() == ["/workspace/sub", "yes"]
        assert kept.metadata["process_id"] in ok(call(client, sid, "process_list"))
        ok(call(client, sid, "shell", command="cd /workspace", reset=True))
        replay(client, sid, 8100)
