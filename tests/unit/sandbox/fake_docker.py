"""A fake Docker daemon at the ``docker.APIClient`` boundary, for unit tests of the Docker backend.

``FakeDockerClient`` stands in for ``docker.APIClient``: it implements the calls our code makes
(``DockerAPI`` in ``dispatcher/sandbox/docker/client.py`` and the death watch in
``docker/backend.py``), including the three SDK internals ``_exec_attach_sync`` uses to keep the
upgraded exec socket whole (``_url``, ``_post_json``, ``_raise_for_status``; their real shape is
pinned by ``test_docker_sdk_contract.py``). Everything above it is the real code: tenacity
retries, error translation, the attach stream and its demultiplexing, the agent channel,
enforcement and reaping.

Inside a fake container, execs are small scripted programs (``fake_containers.py``), chosen by
the command's text (``HANG``, ``DIE``...); a test injects daemon errors with ``fail_next``, kills a container with
``kill``, and reads what happened from ``calls`` and ``containers``.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import docker.errors
import requests

from tests.unit.sandbox.fake_containers import (
    STDERR,
    ConnectFailed,
    FakeAgent,
    FakeContainer,
    FakeExec,
    FallbackCommand,
    pidfile_of,
)


def api_error(status: int, message: str) -> docker.errors.APIError:
    """The error the SDK raises for an HTTP ``status`` from the daemon."""
    response = requests.Response()
    response.status_code = status
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(message, response=response, explanation=message)


class EventStream:
    """What ``APIClient.events(decode=True)`` returns: a blocking iterator, closable from any thread."""

    def __init__(self, filters: Mapping[str, Any]) -> None:
        self.filters = filters
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def push(self, event: dict[str, Any]) -> None:
        self._queue.put(event)

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while (event := self._queue.get()) is not None:
            yield event


class FakeDockerClient:
    """Just enough of ``docker.APIClient`` for the sandbox backend, with injectable failures."""

    def __init__(self) -> None:
        self.containers_by_id: dict[str, FakeContainer] = {}
        self.execs: dict[str, FakeExec] = {}
        self.calls: list[str] = []
        self.slot_mounts: dict[str, str] = {}
        """Host directory -> the directory mounted on it (``FakeSlotMounts``: the warm pool's)."""
        self.images = {"dispatcher-sandbox:latest"}
        self.deaths_left = 1
        """How many ``DIE`` commands still kill their container (later ones just run)."""
        self.agent_runs = True
        """False: the image has no python3, the agent exec exits 127 at once."""
        self.connect_exits: list[int] = []
        """The next agents started with ``--connect`` exit with these statuses, in turn, without
        connecting (3: it could not connect; anything else: it died starting)."""
        self.agent_program: Callable[[FakeExec], None] | None = None
        """Runs in place of the scripted ``FakeAgent`` (tests/contract: the real agent)."""
        self._failures: dict[str, list[BaseException]] = {}
        self._streams: list[EventStream] = []
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self.closed = False

    # -- test controls -------------------------------------------------------------------

    def fail_next(self, method: str, *errors: BaseException) -> None:
        """The next ``len(errors)`` calls of ``method`` raise these, in order."""
        with self._lock:
            self._failures.setdefault(method, []).extend(errors)

    def kill(self, container_id: str, *, streams_survive: bool = False) -> None:
        """The container dies by itself (what Docker reports as a ``die`` event).

        ``streams_survive``: its attached exec streams stay open (gVisor can leave them so), only
        the event tells.
        """
        with self._lock:
            container = self.containers_by_id[container_id]
            if streams_survive:
                container.state = "exited"
            else:
                self._stop(container)
            for stream in self._streams:
                if self._matches(container, stream.filters):
                    stream.push({"Type": "container", "Action": "die", "id": container.id})

    def _scripted_death(self, container_id: str) -> bool:
        with self._lock:
            if self.deaths_left <= 0:
                return False
            self.deaths_left -= 1
        threading.Thread(target=self.kill, args=(container_id,), name="fake-death", daemon=True).start()
        return True

    @property
    def watchers(self) -> int:
        """Event streams opened (the provider's death watch opens one)."""
        with self._lock:
            return len(self._streams)

    @property
    def containers_alive(self) -> list[FakeContainer]:
        return [c for c in self.containers_by_id.values() if c.state == "running"]

    def add_container(self, labels: Mapping[str, str], state: str = "running") -> str:
        """A container some earlier server left behind."""
        with self._lock:
            cid = f"{next(self._ids):064x}"
            self.containers_by_id[cid] = FakeContainer(
                cid, f"old-{cid[-6:]}", {"labels": dict(labels)}, state
            )
            return cid

    def shutdown(self) -> None:
        """End every fake program and event stream (test teardown)."""
        with self._lock:
            for container in self.containers_by_id.values():
                self._stop(container)
            for stream in self._streams:
                stream.close()
        for ex in list(self.execs.values()):
            if ex.thread is not None:
                ex.thread.join(5)

    # -- plumbing ------------------------------------------------------------------------

    def _call(self, method: str) -> None:
        with self._lock:
            self.calls.append(method)
            pending = self._failures.get(method)
            error = pending.pop(0) if pending else None
        if error is not None:
            raise error

    def _container(self, container_id: str) -> FakeContainer:
        container = self.containers_by_id.get(container_id)
        if container is None:
            for candidate in self.containers_by_id.values():
                if candidate.name == container_id:
                    return candidate
            raise api_error(404, f"No such container: {container_id}")
        return container

    def _stop(self, container: FakeContainer) -> None:
        container.state = "exited"
        for ex in container.execs:
            if ex.running:
                ex.finish(137)

    @staticmethod
    def _matches(container: FakeContainer, filters: Mapping[str, Any]) -> bool:
        wanted = filters.get("label") or []
        for item in [wanted] if isinstance(wanted, str) else wanted:
            key, eq, value = item.partition("=")
            if key not in container.labels or (eq and container.labels[key] != value):
                return False
        return True

    # -- the APIClient surface our code uses ---------------------------------------------

    def ping(self) -> bool:
        self._call("ping")
        return True

    def inspect_image(self, image: str) -> dict[str, Any]:
        self._call("inspect_image")
        if image not in self.images:
            raise api_error(404, f"No such image: {image}")
        return {"Id": f"sha256:{image}"}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    def create_container(self, name: str, **spec: Any) -> dict[str, str]:
        self._call("create_container")
        with self._lock:
            if any(c.name == name for c in self.containers_by_id.values()):
                raise api_error(409, f"Conflict. The container name {name!r} is already in use")
            cid = f"{next(self._ids):064x}"
            self.containers_by_id[cid] = FakeContainer(
                cid, name, spec, die=lambda: self._scripted_death(cid), slot_mounts=self.slot_mounts
            )
        return {"Id": cid}

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        self._call("inspect_container")
        container = self._container(container_id)
        return {"Id": container.id, "State": {"Running": container.state == "running"}}

    def start(self, container_id: str) -> None:
        self._call("start")
        self._container(container_id).state = "running"

    def stop(self, container_id: str, timeout: int = 10) -> None:
        self._call("stop")
        with self._lock:
            self._stop(self._container(container_id))

    def remove_container(self, container_id: str, force: bool = False, v: bool = False) -> None:
        self._call("remove_container")
        with self._lock:
            container = self._container(container_id)
            if container.state == "running" and not force:
                raise api_error(409, "You cannot remove a running container")
            self._stop(container)
            del self.containers_by_id[container.id]

    def containers(self, all: bool = False, filters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        self._call("containers")
        with self._lock:
            return [
                c.summary()
                for c in self.containers_by_id.values()
                if (all or c.state == "running") and self._matches(c, filters or {})
            ]

    def events(self, decode: bool = False, filters: Mapping[str, Any] | None = None) -> EventStream:
        self._call("events")
        stream = EventStream(filters or {})
        with self._lock:
            self._streams.append(stream)
        return stream

    def exec_create(self, container_id: str, cmd: list[str], **options: Any) -> dict[str, str]:
        self._call("exec_create")
        with self._lock:
            container = self._container(container_id)
            if container.state != "running":
                raise api_error(409, f"Container {container_id} is not running")
            ex = FakeExec(f"exec{next(self._ids)}", container, list(cmd), options)
            self.execs[ex.id] = ex
            container.execs.append(ex)
        return {"Id": ex.id}

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        self._call("exec_inspect")
        ex = self.execs.get(exec_id)
        if ex is None:
            raise api_error(404, f"No such exec instance: {exec_id}")
        # Every fake program is a thread of this process: its pid is what a peer sees.
        pid = os.getpid() if ex.running else 0
        return {"ID": ex.id, "Running": ex.running, "ExitCode": ex.exit_code, "Pid": pid}

    def exec_start(self, exec_id: str) -> bytes:
        """A detached-output exec run to completion: the fallback's signals, mount checks."""
        self._call("exec_start")
        ex = self.execs[exec_id]
        code, out = self._short_command(ex)
        ex.exit_code = code
        return out

    def close(self) -> None:
        self.closed = True

    # SDK internals used by DockerAPI._exec_attach_sync (contract: test_docker_sdk_contract.py).

    def _url(self, pathfmt: str, *args: str, **kwargs: Any) -> str:
        return pathfmt.format(*args)

    def _post_json(self, url: str, data: Any, **kwargs: Any) -> _UpgradeResponse:
        self._call("exec_attach")
        exec_id = url.split("/")[2]
        with self._lock:
            ex = self.execs.get(exec_id)
            if ex is None:
                return _UpgradeResponse(None, api_error(404, f"No such exec instance: {exec_id}"))
            if ex.container.state != "running":
                return _UpgradeResponse(None, api_error(409, f"Container {ex.container.id} is not running"))
            host, inner = socket.socketpair()
            ex.sock, ex.running = inner, True
        ex.thread = threading.Thread(target=self._run_exec, args=(ex,), name=f"fake-{ex.id}", daemon=True)
        ex.thread.start()
        return _UpgradeResponse(host, None)

    def _raise_for_status(self, response: _UpgradeResponse) -> None:
        if response.error is not None:
            raise response.error

    # -- programs inside the fake containers ---------------------------------------------

    def _run_exec(self, ex: FakeExec) -> None:
        try:
            if ex.cmd[:2] == ["sh", "-c"] and len(ex.cmd) == 7:  # docker/fallback.py's wrapper
                FallbackCommand(ex).run()
            elif not self.agent_runs:
                ex.send(STDERR, f"exec: {ex.cmd[0]}: not found\n".encode())
                ex.finish(127)
            else:
                if "--connect" in ex.cmd and self.connect_exits:
                    ex.finish(self.connect_exits.pop(0))
                    return
                if self.agent_program is not None:
                    self.agent_program(ex)
                    return
                try:
                    agent = FakeAgent(ex)
                except ConnectFailed:
                    ex.finish(3)
                    return
                agent.run()
        except OSError:
            pass  # the container went away under it
        finally:
            if ex.running:
                ex.finish(0)
            else:  # finished meanwhile (its container stopped), maybe before its agent connected
                ex.close()

    def _short_command(self, ex: FakeExec) -> tuple[int, bytes]:
        cmd = ex.cmd
        if cmd[:1] == ["stat"]:  # _verify_mounts: what the container sees at each target
            moved = ex.container.moved
            mounts = {
                m["Target"]: moved.get(m["Source"], m["Source"])
                for m in ex.container.spec["host_config"]["mounts"]
            }
            lines = []
            for target in cmd[3:]:
                st = os.stat(mounts[target.removesuffix("/.")])
                lines.append(f"{st.st_dev} {st.st_ino}\n")
            return 0, "".join(lines).encode()
        if cmd[:2] == ["test", "-f"]:  # a file the container has: here, only what is mounted
            mounted = {m["Target"] for m in ex.container.spec.get("host_config", {}).get("mounts") or ()}
            return (0 if cmd[2] in mounted else 1), b""
        if cmd[:2] == ["sh", "-c"] and cmd[3:4] == ["kill"]:  # the fallback's kill script
            sig = "KILL" if "kill -KILL" in cmd[2] else "TERM"
            for other in ex.container.execs:
                if other.running and pidfile_of(other) == cmd[4]:
                    other.signals.put(sig)
            return 0, b""
        return 127, f"fake docker: no program for {cmd!r}\n".encode()


class _Raw:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def close(self) -> None:
        pass  # the SDK's SocketIO: closing it leaves the socket to its owner


class _Buffered:
    def __init__(self, sock: socket.socket) -> None:
        self.raw = _Raw(sock)

    def peek(self) -> bytes:
        return b""  # nothing was read past the upgrade headers


class _UpgradeResponse:
    """The response to ``POST /exec/{id}/start`` with ``Upgrade: tcp``, as far as the SDK exposes it."""

    def __init__(self, sock: socket.socket | None, error: BaseException | None) -> None:
        self.error = error
        self.status_code = 101 if error is None else 500
        fp = type("HTTPResponse", (), {"fp": _Buffered(sock)})() if sock is not None else None
        self.raw = type("urllib3Response", (), {"_fp": fp})()

    def close(self) -> None:
        pass
