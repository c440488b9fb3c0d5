"""The stand-in Kubernetes API server against our own client: REST verbs, watch, Status errors,
attach, and each Pod setting as the Docker container it becomes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import docker
import pytest

from tests.kube_standin import StandIn
from tests.kube_standin.runtime import LABEL_UID
from tests.kubernetes.helpers import Kube, Obj, pod, unavailable
from tests.polling import until

pytestmark = pytest.mark.docker

V4, V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"


def container_of(client: docker.DockerClient, obj: Obj) -> Any:
    (found,) = client.containers.list(all=True, filters={"label": f"{LABEL_UID}={obj['metadata']['uid']}"})
    return found


HARDENED: Obj = {
    "stdin": True,
    "securityContext": {
        "runAsUser": 1234,
        "runAsGroup": 2345,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "resources": {"limits": {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "1Gi"}},
    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "work", "mountPath": "/workspace"}],
}


async def test_kubernetes_pod_becomes_a_hardened_container(
    kube: Kube, kube_docker: docker.DockerClient
) -> None:
    await kube.create(
        "persistentvolumeclaims",
        {
            "metadata": {"name": "ws"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    body = pod("hard", ["cat"], **HARDENED)
    body["spec"]["volumes"] = [
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "work", "persistentVolumeClaim": {"claimName": "ws"}},
    ]
    body["spec"].update(
        automountServiceAccountToken=False, enableServiceLinks=False, securityContext={"fsGroup": 2345}
    )
    created = await kube.create("pods", body)
    await kube.wait_phase("hard", "Running")

    attrs = container_of(kube_docker, created).attrs
    host = attrs["HostConfig"]
    assert attrs["Config"]["User"] == "1234:2345"
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 256 * 2**20
    assert host["PidsLimit"] == 1024
    assert host["Tmpfs"] == {"/tmp": f"mode=0777,size={64 * 2**20}"}
    assert attrs["Config"]["OpenStdin"] is True
    (bind,) = host["Binds"]
    assert bind.endswith("/pvc/" + kube.namespace + "/ws:/workspace:rw")

    # The fsGroup owns the claim's directory, so the non-root user can write the workspace.
    result = container_of(kube_docker, created).exec_run(
        ["sh", "-c", "touch /workspace/f && id -G && touch /etc/x"]
    )
    assert b"2345" in result.output
    assert b"Read-only file system" in result.output


async def test_kubernetes_phase_follows_the_container(kube: Kube) -> None:
    await kube.create("pods", pod("ok", ["true"]))
    await kube.create("pods", pod("bad", ["sh", "-c", "exit 3"]))
    done = await kube.wait_phase("ok", "Succeeded", "Failed")
    failed = await kube.wait_phase("bad", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded"
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


async def test_kubernetes_run_as_non_root_refuses_a_root_pod(kube: Kube) -> None:
    await kube.create("pods", pod("root", ["true"], securityContext={"runAsUser": 0, "runAsNonRoot": True}))

    async def refused() -> bool:
        state = (await kube.get("pods", "root"))["status"]["containerStatuses"][0]["state"]
        return bool(state.get("waiting", {}).get("reason") == "CreateContainerConfigError")

    await until(refused, "runAsNonRoot refusal", timeout=30)


async def test_kubernetes_label_selectors_pick_objects(kube: Kube) -> None:
    for name, labels in (
        ("a", {"session": "s1", "tenant": "t1"}),
        ("b", {"session": "s2", "tenant": "t1"}),
        ("c", {"tenant": "t2"}),
    ):
        await kube.create(
            "networkpolicies",
            {"metadata": {"name": name, "labels": labels}, "spec": {"podSelector": {}}},
            group="networking.k8s.io",
        )
    netpol = {"group": "networking.k8s.io"}
    assert await kube.names("networkpolicies", "session=s1", **netpol) == ["a"]
    assert await kube.names("networkpolicies", "tenant==t1,session!=s1", **netpol) == ["b"]
    assert await kube.names("networkpolicies", "session in (s1, s2)", **netpol) == ["a", "b"]
    assert await kube.names("networkpolicies", "tenant notin (t1)", **netpol) == ["c"]
    assert await kube.names("networkpolicies", "session", **netpol) == ["a", "b"]
    assert await kube.names("networkpolicies", "!session", **netpol) == ["c"]
    assert await kube.names("networkpolicies", "", **netpol) == ["a", "b", "c"]


async def test_kubernetes_errors_are_status_objects(kube: Kube, standin: StandIn) -> None:
    status, body = await kube.request("GET", kube.url("pods", "missing"))
    assert (status, body["kind"], body["reason"], body["details"]["name"]) == (
        404,
        "Status",
        "NotFound",
        "missing",
    )

    await kube.create("persistentvolumeclaims", {"metadata": {"name": "twice"}, "spec": {}})
    status, body = await kube.request(
        "POST", kube.url("persistentvolumeclaims"), json={"metadata": {"name": "twice"}, "spec": {}}
    )
    assert (status, body["reason"]) == (409, "AlreadyExists")

    status, body = await kube.request(
        "POST", kube.url("pods"), json=pod("Bad_Name", ["true"], labels={"x": "not ok!"})
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert {c["field"] for c in body["details"]["causes"]} == {"metadata.name", "metadata.labels"}

    status, body = await kube.request("GET", kube.url("pods"), params={"labelSelector": "a in (b"})
    assert (status, body["reason"]) == (400, "BadRequest")

    status, body = await kube.request(
        "POST",
        kube.url("pods"),
        json={**pod("rc", ["true"]), "spec": {**pod("rc", ["true"])["spec"], "runtimeClassName": "kata"}},
    )
    assert (status, body["reason"]) == (403, "Forbidden")

    async with Kube.connect(standin, kube.namespace, token="wrong") as stranger:
        status, body = await stranger.request("GET", stranger.url("pods"))
    assert (status, body["kind"], body["reason"]) == (401, "Status", "Unauthorized")

    async with Kube.connect(standin, "no-such-namespace") as lost:
        status, body = await lost.request("POST", lost.url("pods"), json=pod("p", ["true"]))
    assert (status, body["details"]["kind"]) == (404, "namespaces")


async def test_kubernetes_watch_streams_a_pods_life(kube: Kube) -> None:
    _, listed = await kube.request("GET", kube.url("pods"), params={"labelSelector": "app=w"})
    since = listed["metadata"]["resourceVersion"]
    events: list[tuple[str, str]] = []

    async def watch() -> None:
        params = {"watch": "1", "labelSelector": "app=w", "resourceVersion": since}
        async with kube.session.get(kube.url("pods"), params=params, ssl=kube.ssl) as response:
            async for line in response.content:
                event = json.loads(line)
                events.append((event["type"], event["object"]["status"].get("phase", "")))
                if event["type"] == "DELETED":
                    return

    watcher = asyncio.create_task(watch())
    await kube.create("pods", pod("other", ["true"], labels={"app": "x"}))  # not selected
    await kube.create("pods", pod("w", ["sleep", "30"], labels={"app": "w"}))
    await kube.wait_phase("w", "Running")
    await kube.delete("pods", "w")
    await asyncio.wait_for(watcher, 60)
    assert events[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in events
    assert events[-1][0] == "DELETED"

    # A watch from a resource version replays what happened since, then the current state.
    params = {"watch": "1", "labelSelector": "app=w", "resourceVersion": since, "timeoutSeconds": "1"}
    async with kube.session.get(kube.url("pods"), params=params, ssl=kube.ssl) as response:
        replayed = [json.loads(line)["type"] async for line in response.content]
    assert replayed[0] == "ADDED" and replayed[-1] == "DELETED"


async def test_kubernetes_delete_stops_and_removes_the_container(
    kube: Kube, kube_docker: docker.DockerClient
) -> None:
    created = await kube.create("pods", pod("gone", ["sleep", "300"]))
    await kube.wait_phase("gone", "Running")
    marked = await kube.delete("pods", "gone")
    assert marked["metadata"]["deletionTimestamp"]
    await kube.wait_gone("gone")
    assert (
        kube_docker.containers.list(all=True, filters={"label": f"{LABEL_UID}={created['metadata']['uid']}"})
        == []
    )


async def test_kubernetes_claim_outlives_its_pods(kube: Kube) -> None:
    await kube.create(
        "persistentvolumeclaims",
        {"metadata": {"name": "keep"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}},
    )
    claim = await kube.get("persistentvolumeclaims", "keep")
    assert claim["status"]["phase"] == "Bound"
    # fsGroup: a claim's directory belongs to root, as a provisioner makes it; the group opens it.
    volume = {
        "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "keep"}}],
        "securityContext": {"fsGroup": 4000},
    }
    mount: dict[str, Any] = {"volumeMounts": [{"name": "w", "mountPath": "/w"}]}
    writer = pod("writer", ["sh", "-c", "echo kept > /w/file"], **mount)
    writer["spec"].update(volume)
    await kube.create("pods", writer)
    assert (await kube.wait_phase("writer", "Succeeded", "Failed"))["status"]["phase"] == "Succeeded"
    reader = pod("reader", ["grep", "-q", "kept", "/w/file"], **mount)
    reader["spec"].update(volume)
    await kube.create("pods", reader)
    assert (await kube.wait_phase("reader", "Succeeded", "Failed"))["status"]["phase"] == "Succeeded"


async def attach(kube: Kube, name: str, protocol: str) -> aiohttp.ClientWebSocketResponse:
    url = kube.url("pods", name) + "/attach?stdin=true&stdout=true&stderr=true"
    return await kube.session.ws_connect(url, protocols=[protocol], ssl=kube.ssl)


async def read_until(ws: aiohttp.ClientWebSocketResponse, channel: int, want: bytes) -> bytes:
    got = b""
    while want not in got:
        msg = await asyncio.wait_for(ws.receive(), 30)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        if msg.data[0] == channel:
            got += msg.data[1:]
    return got


@pytest.mark.parametrize("protocol", [V4, V5])
async def test_kubernetes_attach_carries_stdin_and_stdout(kube: Kube, protocol: str) -> None:
    await kube.create("pods", pod("cat", ["sh", "-c", "cat; echo bye >&2"], stdin=True, stdinOnce=True))
    await kube.wait_phase("cat", "Running")
    async with await attach(kube, "cat", protocol) as ws:
        assert ws.protocol == protocol
        await ws.send_bytes(b"\x00ping\n")
        assert b"ping\n" in await read_until(ws, 1, b"ping\n")
        if protocol == V4:
            return  # v4 cannot half-close stdin: the client just goes
        # v5's close channel half-closes stdin: cat ends, the shell says bye, the status follows,
        # then the server closes the stream.
        await ws.send_bytes(b"\xff\x00")
        await read_until(ws, 2, b"bye")
        status = await read_until(ws, 3, b"}")
        assert json.loads(status)["status"] == "Success"
        assert (await asyncio.wait_for(ws.receive(), 30)).type == aiohttp.WSMsgType.CLOSE
    await kube.wait_phase("cat", "Succeeded")


async def test_kubernetes_attach_refuses_spdy_and_plain_requests(kube: Kube) -> None:
    await kube.create("pods", pod("cat", ["cat"], stdin=True))
    await kube.wait_phase("cat", "Running")
    url = kube.url("pods", "cat") + "/attach?stdin=true&stdout=true"
    status, body = await kube.request("POST", url, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1"})
    assert (status, body["reason"]) == (400, "BadRequest") and "SPDY" in body["message"]
    status, body = await kube.request("GET", url)
    assert status == 400


async def test_kubernetes_runtime_class_gvisor_runs_under_runsc(
    kube: Kube, kube_docker: docker.DockerClient
) -> None:
    if "runsc" not in (kube_docker.info().get("Runtimes") or {}):
        unavailable("runsc is not a Docker runtime here (scripts/ensure-runsc.sh registers it)")
    body = pod("gv", ["sh", "-c", "dmesg 2>/dev/null | grep -q gVisor || cat /proc/version"])
    body["spec"]["runtimeClassName"] = "gvisor"
    created = await kube.create("pods", body)
    await kube.wait_phase("gv", "Succeeded", "Failed")
    assert container_of(kube_docker, created).attrs["HostConfig"]["Runtime"] == "runsc"
