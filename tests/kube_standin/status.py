"""``Status`` objects: how the API server reports every error (and a successful delete)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    reason: str
    message: str
    field: str = ""


@dataclass
class ApiError(Exception):
    """An error the server answers with a ``Status`` body; raised anywhere in a handler."""

    code: int
    reason: str
    message: str
    kind: str = ""
    name: str = ""
    group: str = ""
    causes: list[Cause] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [
                {"reason": c.reason, "message": c.message, **({"field": c.field} if c.field else {})}
                for c in self.causes
            ]
        if details:
            status["details"] = details
        return status


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', resource, name, group)


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(409, "AlreadyExists", f'{qualified} "{name}" already exists', resource, name, group)


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> ApiError:
    listed = ", ".join(f"{c.field}: {c.message}" for c in causes)
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {listed}', kind, name, group, causes)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(resource: str, name: str, message: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: {message}', resource, name)


def success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
