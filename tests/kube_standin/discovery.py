"""What clients read before they ask for objects: versions, resource lists and ``Table`` rows.

The legacy (unaggregated) discovery documents: kubectl asks for the aggregated form first and falls
back when the answer is plain ``application/json``, as it does against older servers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.kube_standin.store import CONFIGMAP, KINDS, POD, PVC, Kind

Obj = dict[str, Any]

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-standin",
    "platform": "linux/amd64",
}


def api_versions(host: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    }


GROUPS = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [
        {
            "name": group,
            "versions": [{"groupVersion": f"{group}/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": f"{group}/v1", "version": "v1"},
        }
        for group in sorted({g for g, _ in KINDS if g})
    ],
}


def resources(group: str) -> Obj:
    listed: list[Obj] = [
        {
            "name": kind.plural,
            "singularName": kind.kind.lower(),
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": list(kind.verbs),
            "shortNames": list(kind.short_names),
        }
        for (g, _), kind in KINDS.items()
        if g == group
    ]
    if group == "":
        listed.append(
            {
                "name": "pods/attach",
                "singularName": "",
                "namespaced": True,
                "kind": "PodAttachOptions",
                "verbs": ["create", "get"],
            }
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/v1" if group else "v1",
        "resources": listed,
    }


def _age(obj: Obj) -> str:
    created = datetime.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC
    )
    seconds = int((datetime.now(UTC) - created).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def _pod_row(pod: Obj) -> list[Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    status = pod.get("status", {}).get("phase", "Pending")
    for s in statuses:
        waiting = s.get("state", {}).get("waiting") or s.get("state", {}).get("terminated")
        if waiting and waiting.get("reason"):
            status = waiting["reason"]
    if pod["metadata"].get("deletionTimestamp"):
        status = "Terminating"
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return [pod["metadata"]["name"], f"{ready}/{len(pod['spec']['containers'])}", status, restarts, _age(pod)]


def _pvc_row(pvc: Obj) -> list[Any]:
    status = pvc.get("status") or {}
    return [
        pvc["metadata"]["name"],
        status.get("phase", "Pending"),
        (pvc.get("spec") or {}).get("volumeName", ""),
        (status.get("capacity") or {}).get("storage", ""),
        ",".join(status.get("accessModes") or []),
        (pvc.get("spec") or {}).get("storageClassName", ""),
        _age(pvc),
    ]


def _configmap_row(configmap: Obj) -> list[Any]:
    keys = len(configmap.get("data") or {}) + len(configmap.get("binaryData") or {})
    return [configmap["metadata"]["name"], keys, _age(configmap)]


def _default_row(obj: Obj) -> list[Any]:
    return [obj["metadata"]["name"], _age(obj)]


_COLUMNS = {
    POD: ["Name", "Ready", "Status", "Restarts", "Age"],
    PVC: ["Name", "Status", "Volume", "Capacity", "Access Modes", "StorageClass", "Age"],
    CONFIGMAP: ["Name", "Data", "Age"],
}
_ROWS = {POD: _pod_row, PVC: _pvc_row, CONFIGMAP: _configmap_row}


def table(kind: Kind, items: list[Obj], resource_version: str) -> Obj:
    """The server-side printing kubectl asks for (``Accept: ...;as=Table``)."""
    columns = _COLUMNS.get(kind, ["Name", "Age"])
    row = _ROWS.get(kind, _default_row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": c,
                "type": "integer" if c in ("Restarts", "Data") else "string",
                "format": "name" if c == "Name" else "",
                "description": "",
                "priority": 0,
            }
            for c in columns
        ],
        "rows": [
            {
                "cells": row(obj),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
            for obj in items
        ],
    }
