"""What a command sees from inside a default sandbox: hardened, bounded, and harmless to the server."""

from __future__ import annotations

import asyncio
import os

import pytest

from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


async def test_runs_as_non_root_without_capabilities(sandbox: Sandbox) -> None:
    ran = await run(sandbox, "id -u; id -g; grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status")
    assert ran.result.exit_code == 0, ran.err
    uid, gid, *status = ran.out.splitlines()
    assert uid != "0" and gid != "0"
    fields = dict(line.split(":\t") for line in status)
    assert int(fields["CapEff"], 16) == 0
    assert int(fields["CapPrm"], 16) == 0
    assert fields["NoNewPrivs"] == "1"


async def test_no_network_interface_but_loopback(sandbox: Sandbox) -> None:
    ran = await run(sandbox, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert ran.result.exit_code == 0, ran.err
    assert ran.out.split() == ["lo"]


async def test_root_filesystem_is_read_only_and_tmp_is_writable(sandbox: Sandbox) -> None:
    ran = await run(sandbox, "touch /etc/owned; echo rc=$?; touch /usr/owned; echo rc=$?")
    assert ran.out.split() == ["rc=1", "rc=1"]
    assert "Read-only file system" in ran.err
    ran = await run(sandbox, "echo hi > /tmp/t && cat /tmp/t && echo hi > /workspace/w && cat w")
    assert ran.result.exit_code == 0, ran.err
    assert ran.out == "hi\nhi\n"


async def test_workspace_files_belong_to_the_sandbox_user(sandbox: Sandbox, session: Session) -> None:
    await sandbox.write("made/by/sandbox.txt", "x")
    st = os.stat(os.path.join(session.workspace_path, "made/by/sandbox.txt"))
    assert st.st_uid == 1000 and st.st_gid == 1000


async def test_pids_limit_holds_against_a_fork_bomb(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(pids_limit=64))
    sandbox = provider.sandbox_for(make_provider.session())
    # Count the background sleepers that actually started; every failed fork is one the limit held.
    bomb = "n=0; for i in $(seq 1 200); do (sleep 5 &) 2>/dev/null && n=$((n+1)); done; echo started=$n"
    ran = await run(sandbox, bomb, timeout=20)
    started = int(ran.out.strip().rsplit("=", 1)[1])
    assert 0 < started < 64
    assert "Cannot fork" in ran.err or started < 64


async def test_classic_fork_bomb_is_killed_and_the_sandbox_recovers(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(pids_limit=64))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "bomb() { bomb | bomb & }; bomb; sleep 30", timeout=2, grace=0.5)
    # Either the shell lives until the timeout kills its group, or the bomb has taken every process
    # slot before the shell can fork `sleep` and it gives up on its own; which one is a race.
    # Either way the next call must be answered (the leftovers are killed if they are in its way).
    gave_up = ran.result.exit_code not in (None, 0) and "Cannot fork" in ran.err
    assert ran.result.timed_out or ran.result.killed or gave_up, ran
    after = await run(sandbox, "echo alive")
    assert after.out == "alive\n"


async def test_memory_bomb_is_killed_and_the_server_is_unharmed(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(mem_limit=96 << 20))
    sandbox = provider.sandbox_for(make_provider.session())
    bomb = "python3 -c 'a = []\nwhile True: a.append(bytearray(8 << 20))'"
    ran = await run(sandbox, bomb, timeout=60)
    # The kernel's OOM killer picks the biggest process in the container's cgroup: the bomb.
    assert ran.result.exit_code != 0
    assert ran.result.signal == 9 or ran.result.exit_code == 137 or ran.result.killed
    after = await run(sandbox, "echo alive")
    assert after.out == "alive\n"


async def test_large_output_does_not_grow_server_memory(sandbox: Sandbox) -> None:
    total = 200 << 20
    received = 0
    await run(sandbox, "true")  # container and agent up before the baseline is taken
    peak = before = _vm_rss()

    def on_output(stream: str, data: bytes) -> None:
        nonlocal received, peak
        received += len(data)
        if received % (4 << 20) < len(data):
            peak = max(peak, _vm_rss())

    command = f"head -c {total} /dev/zero | tr '\\0' a"
    result = await sandbox.exec(ExecRequest(command, timeout=120), on_output, asyncio.Event())
    peak = max(peak, _vm_rss())
    assert result.exit_code == 0
    assert received == total
    assert peak - before <= 64 << 20, f"RSS grew by {(peak - before) >> 20} MiB"


def _vm_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_an_agent_started_again_ignores_what_commands_left_for_python(
    make_provider: ProviderFactory,
) -> None:
    """HOME is /tmp, so a command can leave a usercustomize.py in python's user site-packages. The
    agent a restarted server starts in the same container (adoption) runs ``python3 -I``: it does not
    import it."""
    provider = make_provider()
    session = make_provider.session()
    sandbox = provider.sandbox_for(session)
    plant = (
        'site=$(python3 -c "import site; print(site.getusersitepackages())") && mkdir -p "$site" && '
        'printf \'open("/tmp/imported", "w").close()\\n\' > "$site/usercustomize.py" && '
        'python3 -c "" && test -e /tmp/imported && rm /tmp/imported && echo planted'
    )
    ran = await run(sandbox, plant)
    assert ran.out.strip() == "planted", ran.err  # a plain python3 in the sandbox does import it
    container_id = sandbox.container_id
    assert container_id is not None
    link = await provider.start_agent(container_id, session)  # as adoption does after a restart
    assert link is not None
    stream, channel = link  # started: it answered its first ping
    await channel.close()
    stream.close()
    ran = await run(sandbox, 'test -e /tmp/imported && echo imported || echo clean; ls "$HOME/.local"')
    assert ran.out.split() == ["clean", "lib"], ran.err  # not imported, though still there
