"""Errors as the API server reports them: ``meta.k8s.io/v1`` Status objects with the same
codes, reasons and message shapes as ``k8s.io/apimachinery/pkg/api/errors``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_standin.apiserver.registry import ResourceType
from kube_standin.errors import StandinError

__all__ = [
    "Cause",
    "StatusError",
    "already_exists",
    "bad_request",
    "conflict",
    "forbidden",
    "gone",
    "internal_error",
    "invalid",
    "method_not_supported",
    "not_found",
    "status_object",
    "unauthorized",
    "unsupported_media_type",
]


@dataclass(frozen=True, slots=True)
class Cause:
    field: str
    reason: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class StatusError(StandinError):
    """The API server refuses a request with this Kubernetes Status (code, reason, message, details)."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, f"{self.code} {self.reason}: {self.message}")

    def to_status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _details(res: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def not_found(res: ResourceType, name: str) -> StatusError:
    return StatusError(404, "NotFound", f'{res.group_resource} "{name}" not found', _details(res, name))


def already_exists(res: ResourceType, name: str) -> StatusError:
    return StatusError(
        409, "AlreadyExists", f'{res.group_resource} "{name}" already exists', _details(res, name)
    )


def conflict(res: ResourceType, name: str, why: str) -> StatusError:
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.group_resource} "{name}": {why}',
        _details(res, name),
    )


def invalid(res: ResourceType, name: str, causes: Sequence[Cause]) -> StatusError:
    qualified_kind = f"{res.kind}.{res.group}" if res.group else res.kind
    rendered = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    details = _details(res, name)
    details["kind"] = res.kind
    details["causes"] = [c.to_dict() for c in causes]
    return StatusError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def unauthorized(message: str = "Unauthorized") -> StatusError:
    return StatusError(401, "Unauthorized", message)


def forbidden(res: ResourceType, name: str, why: str) -> StatusError:
    return StatusError(
        403, "Forbidden", f'{res.group_resource} "{name}" is forbidden: {why}', _details(res, name)
    )


def gone(message: str) -> StatusError:
    return StatusError(410, "Expired", message)


def method_not_supported(res: ResourceType | None, verb: str) -> StatusError:
    what = res.group_resource if res else "this resource"
    return StatusError(405, "MethodNotAllowed", f"{verb} is not supported on resources of kind {what!r}")


def unsupported_media_type(content_type: str) -> StatusError:
    accepted = (
        "application/json, application/merge-patch+json, application/strategic-merge-patch+json, "
        "application/json-patch+json, application/apply-patch+yaml"
    )
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type!r}) - "
        f"accepted media types include: {accepted}",
    )


def internal_error(message: str) -> StatusError:
    return StatusError(500, "InternalError", f"Internal error occurred: {message}")
