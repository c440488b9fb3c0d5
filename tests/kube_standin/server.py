"""The stand-in's HTTP surface (aiohttp): discovery, the kinds' REST verbs, watch, attach.

``StandIn`` runs it on 127.0.0.1 at a random port in a thread with its own event loop, so a test
(sync or async, in any event loop) and a ``kubectl`` subprocess can all talk to one server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import socket
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import yaml
from aiohttp import web

from tests.kube_standin import discovery
from tests.kube_standin.attach import check_upgrade, serve_attach
from tests.kube_standin.configmaps import decode, validate_configmap
from tests.kube_standin.podspec import RUNTIMES, Obj, validate_pod
from tests.kube_standin.runtime import PodRuntime, initial_status
from tests.kube_standin.selectors import SelectorError, parse_selector
from tests.kube_standin.status import ApiError, Cause, bad_request, forbidden, success, unauthorized
from tests.kube_standin.store import CONFIGMAP, KINDS, NAMESPACE, POD, PVC, Kind, Store, now

_TRUE = ("1", "true", "True")


def _kind(request: web.Request) -> Kind:
    group = request.match_info.get("group", "")
    try:
        return KINDS[(group, request.match_info["plural"])]
    except KeyError:
        raise ApiError(404, "NotFound", "the server could not find the requested resource") from None


def _no_checks(obj: Obj) -> list[Cause]:
    return []


def _document(build: Callable[[web.Request], Obj]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler answering with a fixed-shape JSON document (discovery)."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(build(request))

    return handler


class Api:
    """Request handlers over one store and one pod runtime."""

    def __init__(self, store: Store, runtime: PodRuntime, token: str) -> None:
        self.store = store
        self.runtime = runtime
        self.token = token

    def app(self) -> web.Application:
        # The API server reads request bodies of up to 3 MiB (aiohttp's default is 1 MiB).
        app = web.Application(middlewares=[self._errors], client_max_size=3 << 20)
        ns = "/namespaces/{namespace}/{plural}"
        for prefix in ("/api/v1", "/apis/{group}/v1"):
            app.router.add_get(prefix + ns, self.list_or_watch)
            app.router.add_post(prefix + ns, self.create)
            app.router.add_get(prefix + ns + "/{name}", self.get)
            app.router.add_delete(prefix + ns + "/{name}", self.delete)
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/pods/{name}/attach", self.attach)
        # Namespaces are cluster-scoped: the same handlers with the namespace "" and plural fixed.
        app.router.add_get("/api/v1/{plural:namespaces}", self.list_or_watch)
        app.router.add_post("/api/v1/{plural:namespaces}", self.create)
        app.router.add_get("/api/v1/{plural:namespaces}/{name}", self.get)
        app.router.add_get("/version", _document(lambda r: discovery.VERSION))
        app.router.add_get("/api", _document(lambda r: discovery.api_versions(r.host)))
        app.router.add_get("/apis", _document(lambda r: discovery.GROUPS))
        app.router.add_get("/api/v1", _document(lambda r: discovery.resources("")))
        app.router.add_get(
            "/apis/{group}/v1", _document(lambda r: discovery.resources(r.match_info["group"]))
        )
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise unauthorized()
            response: web.StreamResponse = await handler(request)
            return response
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.code)
        except web.HTTPNotFound:
            missing = ApiError(404, "NotFound", "the server could not find the requested resource")
            return web.json_response(missing.body(), status=404)

    # -- read -----------------------------------------------------------------------------

    async def get(self, request: web.Request) -> web.Response:
        kind = _kind(request)
        obj = self.store.get(kind, request.match_info.get("namespace", ""), request.match_info["name"])
        return web.json_response(obj)

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        kind = _kind(request)
        namespace = request.match_info.get("namespace", "")
        query = request.query
        try:
            selector = parse_selector(query.get("labelSelector"))
        except SelectorError as exc:
            raise bad_request(str(exc)) from None
        name = _field_name(query.get("fieldSelector"))
        if query.get("watch") in _TRUE:
            return await self._watch(request, kind, namespace, selector, name)
        items = self.store.list(kind, namespace, selector, name)
        body = {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": items,
        }
        if "as=Table" in request.headers.get("Accept", ""):
            return web.json_response(discovery.table(kind, items, self.store.resource_version))
        return web.json_response(body)

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str, selector: Any, name: str | None
    ) -> web.StreamResponse:
        timeout = float(request.query.get("timeoutSeconds", "0") or 0) or None
        events = self.store.watch(kind, namespace, selector, request.query.get("resourceVersion"), name)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)

        async def stream() -> None:
            async for event in events:
                await response.write(json.dumps(event.wire()).encode() + b"\n")

        with contextlib.suppress(TimeoutError, ConnectionResetError):
            try:
                await asyncio.wait_for(stream(), timeout)
            finally:
                await events.aclose()
            await response.write_eof()  # the timeout ended it: a clean end of the stream
        return response

    # -- write ----------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        kind = _kind(request)
        namespace = request.match_info.get("namespace", "")
        if request.content_type != "application/json":
            # JSON only; client-go (1.32+) retries in JSON after a 415, as against a server without protobuf.
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}",
            )
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise bad_request(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise bad_request("the body is not an object")
        body_namespace = (body.get("metadata") or {}).get("namespace")
        if kind.namespaced and body_namespace and body_namespace != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if kind == POD:
            runtime_class = (body.get("spec") or {}).get("runtimeClassName")
            if runtime_class and runtime_class not in RUNTIMES:
                name = (body.get("metadata") or {}).get("name", "")
                raise forbidden("pods", name, f'pod rejected: RuntimeClass "{runtime_class}" not found')
            body.pop("status", None)
            obj = self.store.create(kind, namespace, body, validate_pod, initial_status)
            self.runtime.launch(obj)
        elif kind == CONFIGMAP:
            decode(body)
            obj = self.store.create(kind, namespace, body, validate_configmap)
        else:
            obj = self.store.create(kind, namespace, body, _no_checks)
            if kind == PVC:
                self.runtime.claim_created(obj)
        return web.json_response(obj, status=201)

    async def delete(self, request: web.Request) -> web.Response:
        kind = _kind(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if kind == CONFIGMAP:
            # No finalizer, no graceful deletion: the real server answers a Status, not the object.
            gone = self.store.delete(kind, namespace, name)
            details = {"name": name, "kind": kind.plural, "uid": gone["metadata"]["uid"]}
            return web.json_response({**success(), "details": details})
        if kind != POD:
            obj = self.store.delete(kind, namespace, name)
            if kind == PVC:
                await self.runtime.claim_deleted(obj)
            return web.json_response(obj)
        options: Obj = {}
        if request.can_read_body:
            with contextlib.suppress(json.JSONDecodeError):
                options = await request.json() or {}
        pod = self.store.get(POD, namespace, name)
        grace_param = request.query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        grace = int(
            grace_param if grace_param is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
        )
        if pod["metadata"].get("deletionTimestamp"):
            return web.json_response(pod)

        def mark(obj: Obj) -> None:
            obj["metadata"]["deletionTimestamp"] = now()
            obj["metadata"]["deletionGracePeriodSeconds"] = grace

        marked = self.store.update(POD, namespace, name, mark) or pod
        self.runtime.delete(marked, grace)
        return web.json_response(marked)

    # -- attach ---------------------------------------------------------------------------

    async def attach(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.store.get(POD, namespace, name)
        query = request.query
        container_spec = pod["spec"]["containers"][0]
        wanted = query.get("container") or container_spec["name"]
        if wanted != container_spec["name"]:
            raise bad_request(f"container {wanted} is not valid for pod {name}")
        stdin = query.get("stdin") in _TRUE
        if stdin and not container_spec.get("stdin"):
            raise bad_request(f"stdin is not enabled for container {wanted} in pod {name}")
        phase = pod["status"].get("phase")
        if phase != "Running":
            raise bad_request(f"container {wanted} is not running (pod phase {phase})")
        check_upgrade(request)
        container = await self.runtime.container_of(pod)
        if container is None:
            raise bad_request(f'container not found ("{wanted}")')
        return await serve_attach(
            request,
            container,
            stdin=stdin,
            stdout=query.get("stdout") in _TRUE,
            stderr=query.get("stderr") in _TRUE,
            tty=query.get("tty") in _TRUE,
        )


def _field_name(field_selector: str | None) -> str | None:
    """The one field selector modelled: ``metadata.name=X`` (what ``kubectl get X -w`` sends)."""
    if not field_selector:
        return None
    key, _, value = field_selector.partition("=")
    if key != "metadata.name":
        raise bad_request(f'field label not supported: "{key}"')
    return value.lstrip("=")


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA): (certificate, key).

    HTTPS is not optional: client-go sends a kubeconfig's credentials only over TLS.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "standin.crt", directory / "standin.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=kube-standin",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class StandIn:
    """The stand-in API server on https://127.0.0.1:<random port>, in a thread with its own loop."""

    def __init__(
        self,
        client: docker.DockerClient,
        state_dir: Path,
        *,
        instance: str,
        token: str | None = None,
        pids_limit: int = 1024,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.state_dir = state_dir
        self.store = Store()
        self.runtime = PodRuntime(
            self.store, client, instance=instance, state_dir=state_dir, pids_limit=pids_limit
        )
        self.url = ""
        self.ca_path, self._key_path = make_certificate(state_dir / "tls")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-standin", daemon=True)
        self._runner: web.AppRunner | None = None

    def kubeconfig(self, path: Path, *, namespace: str = "default", token: str | None = None) -> Path:
        """A kubeconfig for this server (``token`` overrides the right one, to test a 401)."""
        return write_kubeconfig(
            path, server=self.url, token=token or self.token, ca=self.ca_path, namespace=namespace
        )

    def start(self) -> StandIn:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        self.runtime.start(asyncio.get_running_loop())
        self._runner = web.AppRunner(
            Api(self.store, self.runtime, self.token).app(), handle_signals=False, shutdown_timeout=1
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.ca_path, self._key_path)
        self.url = f"https://127.0.0.1:{sock.getsockname()[1]}"
        await web.SockSite(self._runner, sock, ssl_context=context).start()

    def create_namespace(self, name: str) -> None:
        """Make a namespace (kubectl's typed ``create namespace`` sends protobuf, which this refuses)."""

        async def create() -> None:
            self.store.create(NAMESPACE, "", {"metadata": {"name": name}}, _no_checks)

        self.call(create())

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop (e.g. to read the store from a test)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def stop(self) -> None:
        """Close connections, remove every container this instance made, stop the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self.call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.runtime.close()

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_kubeconfig(path: Path, *, server: str, token: str, ca: Path, namespace: str = "default") -> Path:
    """A kubeconfig with one context: ``server`` (trusting ``ca``), bearer-token auth, ``namespace``."""
    ca_data = base64.b64encode(ca.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "standin", "cluster": {"server": server, "certificate-authority-data": ca_data}}
        ],
        "users": [{"name": "standin", "user": {"token": token}}],
        "contexts": [
            {"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": namespace}}
        ],
        "current-context": "standin",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    path.chmod(0o600)
    return path
