"""The Kubernetes sandbox backend against the stand-in: a real Pod (a Docker container) per session,
the real agent attached over pods/attach, the five tools, the hardening, cancellation, enforcement,
a Pod deleted behind the server's back, idle expiry, re-adoption and orphans, and a real kubectl.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.errors import ToolCancelled
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import TextBlock, Tool, ToolOutput
from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.kubernetes.manifests import NETWORK_POLICY
from dispatcher.tools import (
    GlobTool,
    GrepTool,
    ListDirTool,
    PatchFileTool,
    ReadFileTool,
    ShellTool,
    WriteFileTool,
)
from tests.integration.helpers import run, tool_context
from tests.kubernetes.backend_fixtures import IMAGE, KubeProviders
from tests.kubernetes.helpers import Kube, pod
from tests.polling import until

pytestmark = pytest.mark.docker

COUNT_SLEEPS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000 ' || true"


async def call(tool: Tool, sandbox: ContainerSandbox, session: Session, **input: Any) -> ToolOutput:
    context, _ = tool_context(sandbox, session.workspace_path)
    return await tool.execute(input, context)


def text(output: ToolOutput) -> str:
    return "".join(block.text for block in output.content if isinstance(block, TextBlock))


async def pod_names(kube: Kube, selector: str) -> list[str]:
    return await kube.names("pods", selector)


async def test_kubernetes_five_tools_in_a_pod(kube_providers: KubeProviders, kube: Kube) -> None:
    provider = kube_providers()
    await provider.check_ready()
    session = kube_providers.session()
    sandbox = provider.sandbox_for(session)
    body = "".join(f"line {i}\n" for i in range(1, 6))
    written = await call(WriteFileTool(), sandbox, session, path="src/notes.txt", content=body)
    assert written.files_modified == ["src/notes.txt"]
    assert (kube_providers.workspace(session) / "src/notes.txt").read_text() == body  # on the PVC
    out = await call(ReadFileTool(), sandbox, session, path="src/notes.txt", offset=2, limit=2)
    assert "line 2" in text(out) and "line 3" in text(out) and "line 4" not in text(out)
    await call(PatchFileTool(), sandbox, session, path="src/notes.txt", old="line 3", new="three")
    assert "three" in (kube_providers.workspace(session) / "src/notes.txt").read_text()
    listing = await call(ListDirTool(), sandbox, session, path="src")
    assert "notes.txt" in text(listing)
    shell = await call(ShellTool(), sandbox, session, command="grep -c line src/notes.txt; id -u; hostname")
    assert text(shell).split()[:3] == ["4", "1000", "sandbox"]
    found = await call(GrepTool(), sandbox, session, pattern="^three$", path="src")  # the search tools too
    assert text(found) == "src/notes.txt:3:three"
    assert text(await call(GlobTool(), sandbox, session, pattern="**/*.txt")) == "src/notes.txt"
    # One Pod, labelled like the containers are, and the deny-all policy in the namespace.
    pods = await pod_names(kube, f"{LABEL_SESSION}={session.session_id}")
    assert pods == [sandbox.container_id]
    obj = await kube.get("pods", pods[0])
    labels = obj["metadata"]["labels"]
    assert labels[LABEL_TENANT] == "tenant-a" and labels[LABEL_INSTANCE] == provider.instance
    assert await kube.names("networkpolicies", group="networking.k8s.io") == [NETWORK_POLICY]


async def test_kubernetes_pod_is_hardened(kube_providers: KubeProviders, kube: Kube) -> None:
    provider = kube_providers(SandboxConfig(image=IMAGE, mem_limit=256 << 20, tmpfs_size="16m"))
    session = kube_providers.session()
    sandbox = provider.sandbox_for(session)
    ran = await run(
        sandbox,
        "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; touch /root-write 2>&1 | head -c 60;"
        " echo; df -k /tmp | tail -1; { cat /sys/fs/cgroup/memory.max || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; } 2>/dev/null; ls /var/run/secrets/kubernetes.io 2>&1 | tail -c 30;"
        " echo; env | grep -c _SERVICE_ || true; cat /proc/1/cmdline | tr '\\0' ' '",
    )
    out = ran.out
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    assert "Read-only file system" in out
    assert " 16384 " in out  # /tmp: the emptyDir's sizeLimit, in memory
    assert str(256 << 20) in out
    assert "No such file or directory" in out  # no service account token mounted
    assert "\n0\n" in out  # no service links
    assert not out.splitlines()[-1].startswith("python3")  # pid 1 reaps orphans: not the agent
    spec = (await kube.get("pods", sandbox.container_id or ""))["spec"]
    container = spec["containers"][0]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory", "ephemeral-storage"}
    assert container["stdin"] is True and container["stdinOnce"] is False
    assert "ports" not in container  # nothing listens: the server attaches


async def test_kubernetes_cancel_ends_the_process_group(kube_providers: KubeProviders) -> None:
    sandbox = kube_providers().sandbox_for(kube_providers.session())
    seen = asyncio.Event()
    cancel = asyncio.Event()
    task = asyncio.ensure_future(
        run(sandbox, "sleep 1000 & echo started; wait", cancel=cancel, on_chunk=lambda s, d: seen.set())
    )
    await asyncio.wait_for(seen.wait(), 30)
    cancel.set()
    ran = await asyncio.wait_for(task, 10)
    assert ran.result.cancelled and not ran.result.killed
    assert (await run(sandbox, COUNT_SLEEPS)).out.strip() == "0"


async def test_kubernetes_shell_tool_cancelled(kube_providers: KubeProviders) -> None:
    session = kube_providers.session()
    sandbox = kube_providers().sandbox_for(session)
    cancel = asyncio.Event()
    context, deltas = tool_context(sandbox, session.workspace_path, cancel=cancel)
    task = asyncio.ensure_future(ShellTool().execute({"command": "echo go; sleep 1000"}, context))
    await until(lambda: bool(deltas), "the command's first output", timeout=30)
    cancel.set()
    with pytest.raises(ToolCancelled):
        await asyncio.wait_for(task, 10)


async def test_kubernetes_sigterm_ignored_then_killed(kube_providers: KubeProviders) -> None:
    sandbox = kube_providers().sandbox_for(kube_providers.session())
    ran = await run(sandbox, "trap '' TERM; echo stubborn; sleep 1000 & wait", timeout=1, grace=0.5)
    assert ran.result.timed_out and ran.result.killed and ran.out == "stubborn\n"
    assert (await run(sandbox, COUNT_SLEEPS)).out.strip() == "0"


async def test_kubernetes_pod_deleted_past_grace_when_the_agent_cannot_kill(
    kube_providers: KubeProviders, kube: Kube
) -> None:
    provider = kube_providers(SandboxConfig(image=IMAGE, enforce_slack_seconds=1.0))
    sandbox = provider.sandbox_for(kube_providers.session())
    await sandbox.write("f.txt", "kept")
    first = sandbox.container_id
    assert first is not None
    # The command stops the agent itself: its own kill sequence cannot run, so the server's does.
    started = time.monotonic()
    ran = await run(sandbox, "trap '' TERM; kill -STOP $PPID; sleep 1000", timeout=0.5, grace=0.2)
    assert ran.result.killed and ran.result.exit_code is None
    assert time.monotonic() - started < 10
    await kube.wait_gone(first, timeout=30)
    assert await sandbox.read("f.txt") == "kept"  # a new Pod, the same workspace PVC
    assert sandbox.container_id not in (None, first)


async def test_kubernetes_pod_deleted_behind_the_servers_back(
    kube_providers: KubeProviders, kube: Kube
) -> None:
    sandbox = kube_providers().sandbox_for(kube_providers.session())
    await run(sandbox, "true")
    first = sandbox.container_id
    assert first is not None
    seen = asyncio.Event()
    task = asyncio.ensure_future(run(sandbox, "echo working; sleep 1000", on_chunk=lambda s, d: seen.set()))
    await asyncio.wait_for(seen.wait(), 30)
    await kube.delete("pods", first)
    with pytest.raises(SandboxError, match=r"stopped|closed|died"):
        await asyncio.wait_for(task, 30)
    ran = await run(sandbox, "echo back")
    assert ran.out == "back\n"
    assert sandbox.container_id not in (None, first)


async def test_kubernetes_idle_pod_is_deleted(kube_providers: KubeProviders, kube: Kube) -> None:
    sandbox = kube_providers(SandboxConfig(image=IMAGE, idle_ttl_seconds=0.5)).sandbox_for(
        kube_providers.session()
    )
    await run(sandbox, "true")
    first = sandbox.container_id
    assert first is not None
    await kube.wait_gone(first, timeout=30)
    assert (await run(sandbox, "echo again")).out == "again\n"


async def test_kubernetes_readoption_and_orphans(kube_providers: KubeProviders, kube: Kube) -> None:
    instance = kube_providers.new_instance()
    first = kube_providers(instance=instance)
    session = kube_providers.session()
    sandbox = first.sandbox_for(session)
    ran = await run(sandbox, "echo kept > /tmp/keep.txt; sleep 1000 >/dev/null 2>&1 &")
    assert ran.result.exit_code == 0
    adopted = sandbox.container_id
    assert adopted is not None
    await first.detach_all()  # a stop that keeps the sessions: the Pod keeps running
    stray = pod(
        f"stray-{instance}", ["sleep", "1000"], labels={LABEL_INSTANCE: instance, LABEL_SESSION: "nobody"}
    )
    await kube.create("pods", stray)

    second = kube_providers(instance=instance)
    second.expect_container(session, adopted)
    assert await second.remove_orphans() == 1
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert again.container_id == adopted
    assert (await run(again, "cat /tmp/keep.txt")).out == "kept\n"
    assert (await run(again, COUNT_SLEEPS)).out.strip() == "1"
    await kube.wait_gone(stray["metadata"]["name"], timeout=30)
    await second.close_session(session.session_id)
    await kube.wait_gone(adopted, timeout=30)


async def test_kubernetes_real_kubectl_sees_and_attaches(
    kube_providers: KubeProviders, kubeconfig: Path
) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "the machine image ships kubectl"
    session = kube_providers.session()
    sandbox = kube_providers().sandbox_for(session)
    await run(sandbox, "true")

    def kc(*args: str) -> str:
        done = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = await asyncio.to_thread(
        kc, "get", "pods", "-l", f"{LABEL_SESSION}={session.session_id}", "-o", "name"
    )
    assert listed.split() == [f"pod/{sandbox.container_id}"]
    obj = json.loads(await asyncio.to_thread(kc, "get", "pod", sandbox.container_id or "", "-o", "json"))
    assert obj["spec"]["containers"][0]["image"] == IMAGE
    # kubectl attach (no -i: it must not write into the agent's stdin) sees the agent's own frames.
    attach = await asyncio.create_subprocess_exec(
        kubectl, "--kubeconfig", str(kubeconfig), "attach", sandbox.container_id or "", "-c", "agent",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        seen = b""

        async def marker_seen() -> bool:
            nonlocal seen
            await run(sandbox, "echo kubectl-sees-this")
            assert attach.stdout is not None
            with __import__("contextlib").suppress(TimeoutError):
                seen += await asyncio.wait_for(attach.stdout.read(65536), 0.5)
            return b"kubectl-sees-this" in seen

        await until(marker_seen, "kubectl attach to show the agent's output", timeout=30)
    finally:
        attach.kill()
        await attach.wait()
    assert (await run(sandbox, "echo still")).out == "still\n"  # our attachment is unharmed


class EchoGate:
    """An egress proxy stand-in: answers every proxied request itself, connecting nowhere."""

    def __init__(self) -> None:
        self.served: list[tuple[str, str | None]] = []

    def ca_bundle(self, tenant_id: str) -> str | None:
        return None

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await stream.read(4096)
            if not chunk:
                break
            head += chunk
        self.served.append((session_id, head.split(b"\r\n", 1)[0].decode()))
        await stream.write(b"HTTP/1.0 200 OK\r\nContent-Length: 14\r\n\r\nvia the tunnel")
        await stream.close()


FETCH = (
    "python3 -c 'import urllib.request as u; "
    'print(u.urlopen("http://sandbox-egress.invalid/x", timeout=10).read().decode())\''
)


async def test_kubernetes_egress_tunnel_and_its_listener_after_readoption(
    kube_providers: KubeProviders,
) -> None:
    instance = kube_providers.new_instance()
    gate = EchoGate()
    first = kube_providers(instance=instance)
    first.egress = gate
    session = kube_providers.session()
    sandbox = first.sandbox_for(session)
    ran = await run(sandbox, FETCH)
    assert ran.out.strip() == "via the tunnel", ran.err
    assert gate.served == [(session.session_id, "GET http://sandbox-egress.invalid/x HTTP/1.1")]
    pod_name = sandbox.container_id
    assert pod_name is not None
    await first.detach_all()

    second = kube_providers(instance=instance)
    second.egress = gate
    second.expect_container(session, pod_name)
    await second.remove_orphans()
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert again.container_id == pod_name  # the same agent, its listener taken over by this link
    assert (await run(again, FETCH)).out.strip() == "via the tunnel"
    assert len(gate.served) == 2
