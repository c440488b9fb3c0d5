"""The object store: namespaced objects of a few kinds, resource versions, and watches.

Everything runs on the server's event loop, so nothing here locks. Each change gets the next
resource version and is kept in a bounded history, so a watch from a resource version replays what
it missed (or is told 410 Gone when that is older than the history, as the real server does).
"""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.kube_standin.selectors import Selector
from tests.kube_standin.status import ApiError, Cause, already_exists, invalid, not_found

Obj = dict[str, Any]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
HISTORY = 10_000


@dataclass(frozen=True)
class Kind:
    """A resource type the stand-in serves."""

    plural: str
    kind: str
    group: str  # "" for the core group
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "watch")
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"


NAMESPACE = Kind("namespaces", "Namespace", "", ("ns",), namespaced=False)
"""Cluster-scoped: stored under the namespace "". Objects may only be made in one that exists."""
POD = Kind("pods", "Pod", "", ("po",))
PVC = Kind("persistentvolumeclaims", "PersistentVolumeClaim", "", ("pvc",))
CONFIGMAP = Kind("configmaps", "ConfigMap", "", ("cm",))
NETWORK_POLICY = Kind("networkpolicies", "NetworkPolicy", "networking.k8s.io", ("netpol",))
KINDS = {(k.group, k.plural): k for k in (NAMESPACE, POD, PVC, CONFIGMAP, NETWORK_POLICY)}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED
    kind: Kind
    namespace: str
    obj: Obj

    @property
    def resource_version(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])

    def wire(self) -> Obj:
        return {"type": self.type, "object": self.obj}


@dataclass(eq=False)  # kept in a set by identity
class _Watcher:
    kind: Kind
    namespace: str
    selector: Selector
    name: str | None
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    def wants(self, event: Event) -> bool:
        meta = event.obj["metadata"]
        return (
            event.kind == self.kind
            and event.namespace == self.namespace
            and (self.name is None or meta["name"] == self.name)
            and self.selector.matches(meta.get("labels") or {})
        )


def validate_metadata(kind: Kind, obj: Obj) -> list[Cause]:
    """The checks every kind gets: a DNS-1123 name and well-formed labels."""
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    name = meta.get("name", "")
    if not name:
        causes.append(
            Cause("FieldValueRequired", "Required value: name or generateName is required", "metadata.name")
        )
    elif len(name) > 253 or not _SUBDOMAIN.match(name):
        causes.append(
            Cause(
                "FieldValueInvalid",
                f'Invalid value: "{name}": must be a lowercase RFC 1123 subdomain',
                "metadata.name",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label_name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix))) or not (
            len(label_name) <= 63 and _LABEL_NAME.match(label_name)
        ):
            causes.append(
                Cause(
                    "FieldValueInvalid", f'Invalid value: "{key}": not a valid label key', "metadata.labels"
                )
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f'Invalid value: "{value}": not a valid label value',
                    "metadata.labels",
                )
            )
    return causes


class Store:
    """Objects by (kind, namespace, name), with resource versions and watches."""

    def __init__(self) -> None:
        self._objects: dict[tuple[Kind, str, str], Obj] = {}
        self._version = 0
        self._history: deque[Event] = deque(maxlen=HISTORY)
        self._watchers: set[_Watcher] = set()
        self.create(NAMESPACE, "", {"metadata": {"name": "default"}}, lambda obj: [])

    @property
    def resource_version(self) -> str:
        return str(self._version)

    def _publish(self, type_: str, kind: Kind, namespace: str, obj: Obj) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        event = Event(type_, kind, namespace, copy.deepcopy(obj))
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.queue.put_nowait(event)

    def create(
        self,
        kind: Kind,
        namespace: str,
        body: Obj,
        checks: Callable[[Obj], list[Cause]],
        fill: Callable[[Obj], None] | None = None,
    ) -> Obj:
        """Store a new object; its server-set metadata filled in, then ``fill`` (e.g. a Pod's status).

        Raises:
            ApiError: 422 when ``body`` is invalid, 409 when the name is taken.
        """
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if obj.get("kind", kind.kind) != kind.kind:
            raise ApiError(400, "BadRequest", f"the body is a {obj.get('kind')}, not a {kind.kind}")
        causes = validate_metadata(kind, obj) + checks(obj)
        if causes:
            raise invalid(kind.kind, meta.get("name", ""), causes, kind.group)
        if kind.namespaced and (NAMESPACE, "", namespace) not in self._objects:
            raise not_found(NAMESPACE.plural, namespace)
        key = (kind, namespace, meta["name"])
        if key in self._objects:
            raise already_exists(kind.plural, meta["name"], kind.group)
        obj["kind"] = kind.kind
        obj["apiVersion"] = kind.api_version
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if kind.namespaced:
            meta["namespace"] = namespace
        else:
            obj["status"] = {"phase": "Active"}
        if fill is not None:
            fill(obj)
        self._objects[key] = obj
        self._publish("ADDED", kind, namespace, obj)
        return copy.deepcopy(obj)

    def get(self, kind: Kind, namespace: str, name: str) -> Obj:
        """The object, a copy.

        Raises:
            ApiError: 404 when there is none.
        """
        try:
            return copy.deepcopy(self._objects[(kind, namespace, name)])
        except KeyError:
            raise not_found(kind.plural, name, kind.group) from None

    def list(self, kind: Kind, namespace: str, selector: Selector, name: str | None = None) -> list[Obj]:
        return [
            copy.deepcopy(obj)
            for (k, ns, n), obj in sorted(self._objects.items(), key=lambda item: item[0][2])
            if k == kind
            and ns == namespace
            and (name is None or n == name)
            and selector.matches(obj["metadata"].get("labels") or {})
        ]

    def update(self, kind: Kind, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj | None:
        """Apply ``change`` to the stored object and publish MODIFIED; None when it is gone."""
        obj = self._objects.get((kind, namespace, name))
        if obj is None:
            return None
        change(obj)
        self._publish("MODIFIED", kind, namespace, obj)
        return copy.deepcopy(obj)

    def delete(self, kind: Kind, namespace: str, name: str) -> Obj:
        """Remove the object now and publish DELETED.

        Raises:
            ApiError: 404 when there is none.
        """
        obj = self._objects.pop((kind, namespace, name), None)
        if obj is None:
            raise not_found(kind.plural, name, kind.group)
        self._publish("DELETED", kind, namespace, obj)
        return copy.deepcopy(obj)

    def watch(
        self, kind: Kind, namespace: str, selector: Selector, since: str | None, name: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """Events from ``since`` on (None or "0": every current object as ADDED first).

        Checked before any event is read, so the handler can still answer with a Status:

        Raises:
            ApiError: 410 Gone when ``since`` is older than the history kept; 400 when not a number.
        """
        watcher = _Watcher(kind, namespace, selector, name)
        if since in (None, "", "0"):
            backlog = [
                Event("ADDED", kind, namespace, obj) for obj in self.list(kind, namespace, selector, name)
            ]
        else:
            try:
                start = int(since)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from None
            oldest = self._history[0].resource_version if self._history else self._version + 1
            if start + 1 < oldest and start < self._version:
                raise ApiError(410, "Expired", f"too old resource version: {start} ({oldest - 1})")
            backlog = [e for e in self._history if e.resource_version > start and watcher.wants(e)]
        self._watchers.add(watcher)  # now, so nothing published before the first read is missed
        return self._stream(watcher, backlog)

    # Sequence, not list: in this class, `list` is the method above.
    async def _stream(self, watcher: _Watcher, backlog: Sequence[Event]) -> AsyncGenerator[Event, None]:
        try:
            for event in backlog:
                yield event
            while True:
                yield await watcher.queue.get()
        finally:
            self._watchers.discard(watcher)
