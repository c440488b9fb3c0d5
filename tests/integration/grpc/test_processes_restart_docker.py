"""A real ``dispatcher serve`` on Docker, killed and restarted while a process a ``shell`` call
left behind keeps printing: the agent that reads its pipes outlives the server, so the process
never meets a closed pipe (before the process table, its first write after the call was its last).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.integration.grpc.test_restart_docker import serve as serve
from tests.integration.grpc.test_restart_docker import shell
from tests.server.persistence.test_restart import kill9, sigterm
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.docker

# Prints only after the call ended and the server is gone; `|| exit` makes a closed pipe visible.
APP = (
    "(sleep 2; i=0; while [ $i -lt 40 ]; do echo line $i || exit 1; i=$((i+1)); sleep 0.05; done;"
    " touch /tmp/wrote) & echo started"
)


@pytest.mark.parametrize("stop", [kill9, sigterm], ids=["kill-9", "sigterm"])
def test_a_left_process_keeps_printing_across_a_server_restart(
    serve: Callable[..., ServeProcess],
    stop: Callable[[ServeProcess], None],
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        failed, out = shell(client, info.session_id, APP)
        assert not failed and out.startswith("started\n"), out
        assert "[left 1 process running: p_" in out  # its pipes are read by the table from now on
    stop(server)
    server = serve()
    with server.client() as client:
        deadline = time.monotonic() + 30
        while True:
            failed, out = shell(client, info.session_id, "test -e /tmp/wrote && echo yes || echo no")
            assert not failed, "".join(server.stderr)[-4000:]
            if out.strip() == "yes":
                break
            assert time.monotonic() < deadline, "the process died writing to its pipe"
            time.sleep(0.2)
