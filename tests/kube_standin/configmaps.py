"""ConfigMaps: what the API server checks of one, and a Pod's ``configMap`` volume as the kubelet
lays it out on the node.

As the real server: keys match ``[-._a-zA-Z0-9]+`` (at most 253, not ``.``/``..`` or starting
with ``..``), a key is in ``data`` or ``binaryData``, not both, keys and values together hold at
most 1 MiB (422 ``Invalid`` naming the field); a ``binaryData`` value that is not base64, or a
value that is not a string, cannot be decoded (400). There is no update here at all (no PUT or
PATCH), so ``immutable`` is stored and needs nothing more.

A Pod's ``configMap`` volume is written when its container is created (a snapshot: no update can
happen) into the Pod's directory, each file with its ``mode`` (else ``defaultMode``, else 0644),
its group the Pod's ``fsGroup``, and mounted read-only whatever the mount says (the kubelet
forces it). The kubelet's ``..data`` symlink layout is not modelled. A ConfigMap or a listed key
that does not exist keeps the Pod ``ContainerCreating`` until it appears (``missing``), unless the
volume is ``optional``.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from typing import Any

from tests.kube_standin.status import Cause, bad_request

Obj = dict[str, Any]

_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
MAX_BYTES = 1 << 20
"""``MaxSecretSize``: the most a ConfigMap holds, keys and values."""
DEFAULT_MODE = 0o644


def decode(body: Obj) -> None:
    """What a real server fails to decode (400) before it validates anything.

    Raises:
        ApiError: 400 for a non-string value or a ``binaryData`` value that is not base64.
    """
    for field in ("data", "binaryData"):
        values = body.get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise bad_request(
                f'ConfigMap in version "v1" cannot be handled as a ConfigMap: {field} must be an object'
            )
        for key, value in values.items():
            if not isinstance(value, str):
                raise bad_request(
                    f'ConfigMap in version "v1" cannot be handled as a ConfigMap: {field}[{key}] must be a string'
                )
            if field == "binaryData":
                try:
                    base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise bad_request(
                        f'ConfigMap in version "v1" cannot be handled as a ConfigMap: illegal base64 data: {exc}'
                    ) from None
    if "immutable" in body and not isinstance(body["immutable"], bool):
        raise bad_request(
            'ConfigMap in version "v1" cannot be handled as a ConfigMap: immutable must be a boolean'
        )


def _key_problem(key: str) -> str | None:
    if len(key) > 253:
        return "must be no more than 253 characters"
    if key in (".", "..") or key.startswith(".."):
        return "must not be '.' or '..' or start with '..'"
    if not _KEY.match(key):
        return (
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' "
            "(regex used for validation is '[-._a-zA-Z0-9]+')"
        )
    return None


def validate_configmap(obj: Obj) -> list[Cause]:
    """The 422 causes of a decoded ConfigMap."""
    data: dict[str, str] = obj.get("data") or {}
    binary: dict[str, str] = obj.get("binaryData") or {}
    causes: list[Cause] = []
    for field, values in (("data", data), ("binaryData", binary)):
        for key in values:
            problem = _key_problem(key)
            if problem is not None:
                causes.append(
                    Cause("FieldValueInvalid", f'Invalid value: "{key}": {problem}', f"{field}[{key}]")
                )
    for key in sorted(set(data) & set(binary)):
        causes.append(
            Cause(
                "FieldValueInvalid",
                f'Invalid value: "{key}": duplicate of key present in binaryData',
                f"data[{key}]",
            )
        )
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    size += sum(len(k) + len(base64.b64decode(v)) for k, v in binary.items())
    if size > MAX_BYTES:
        causes.append(Cause("FieldValueTooLong", f"Too long: must have at most {MAX_BYTES} bytes", "data"))
    return causes


def validate_volume(index: int, source: Obj) -> list[Cause]:
    """The 422 causes of a Pod's ``configMap`` volume source."""
    where = f"spec.volumes[{index}].configMap"
    causes: list[Cause] = []
    if not source.get("name"):
        causes.append(Cause("FieldValueRequired", "Required value", f"{where}.name"))
    mode = source.get("defaultMode")
    if mode is not None and not (isinstance(mode, int) and 0 <= mode <= 0o777):
        causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {mode}: must be a number between 0 and 0777 (octal), both inclusive",
                f"{where}.defaultMode",
            )
        )
    for i, item in enumerate(source.get("items") or []):
        if not item.get("key"):
            causes.append(Cause("FieldValueRequired", "Required value", f"{where}.items[{i}].key"))
        path = str(item.get("path") or "")
        if not path or path.startswith("/") or ".." in path.split("/"):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: \"{path}\": must be a relative path without '..'",
                    f"{where}.items[{i}].path",
                )
            )
    return causes


def files(source: Obj, configmap: Obj | None) -> dict[str, tuple[bytes, int]] | str:
    """The volume's files (path → (bytes, mode)), or why the kubelet cannot mount it yet."""
    name = source.get("name")
    if configmap is None:
        if source.get("optional"):
            return {}
        return f'configmap "{name}" not found'
    content = {k: v.encode() for k, v in (configmap.get("data") or {}).items()}
    content.update({k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()})
    mode = source.get("defaultMode", DEFAULT_MODE)
    items = source.get("items")
    if items is None:
        return {key: (value, mode) for key, value in content.items()}
    out: dict[str, tuple[bytes, int]] = {}
    for item in items:
        if item["key"] not in content:
            if source.get("optional"):
                continue
            return f"configmap references non-existent config key: {item['key']}"
        out[item["path"]] = (content[item["key"]], item.get("mode", mode))
    return out


def write_volume(root: Path, contents: dict[str, tuple[bytes, int]], fs_group: int | None) -> None:
    """The volume's files under ``root`` (made fresh), group ``fs_group`` and readable by it."""
    root.mkdir(parents=True, exist_ok=True)
    for path, (data, mode) in contents.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if fs_group is not None:
            os.chown(target, -1, fs_group)
            mode |= 0o040
        target.chmod(mode)
