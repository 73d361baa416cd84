"""The manager's OpenAPI document: what FastAPI derives from the routes, completed with what a
client (and a schema-driven fuzzer) must know to use the API correctly.

- Authentication is the ``bearerAuth`` HTTP bearer scheme on every ``/api/v1`` operation, not a
  free-form ``Authorization`` header parameter (the routes read the header themselves).
- Every error an operation can answer is documented with its status and the
  :class:`manager_api.models.ErrorBody` shape the manager really sends — including ``422``, which
  FastAPI would otherwise describe with its own ``HTTPValidationError`` body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from manager_api import models as api

__all__ = ["ERRORS", "complete_openapi", "install_openapi"]

SECURITY_SCHEME = "bearerAuth"

#: status → when the manager answers it (the ``code`` values of :mod:`manager_api.errors`)
ERRORS: dict[int, str] = {
    401: "Unauthenticated: no, unknown, expired or wrong-audience bearer token",
    403: (
        "PermissionDenied: a plugin acting for another node, an operator attaching, a caller without a "
        "role, an attach whose ResourceClaim does not allocate the device (on the node)"
    ),
    404: "DeviceNotFound, NodeNotFound or NotFound: names what is not there",
    409: (
        "DeviceBusy (retriable: held by another claim or node, or being detached), DeviceUnhealthy, "
        "NodeBindingLimit, or BudgetExceeded: a DeviceBudget caps the claim's agent tree (not retried "
        "at once: asked again when the tree releases)"
    ),
    410: (
        "ResyncRequired: the changes since that version are no longer held (or it counts in another "
        "manager incarnation's epoch); read GET /api/v1/inventory and follow the changes from there"
    ),
    413: "PayloadTooLarge: a request body larger than the largest claim report (refused unread)",
    422: "InvalidRequest: names every malformed field",
    429: "TooManyRequests (retriable): more token reviews from this client address than its share",
    502: (
        "BindFailed: the fabric refused or failed the operation; messageId is the fabric's own. "
        "BindRefused: it refuses this device/node pair for good (not cabled), never retriable"
    ),
    503: "NotLeader or FabricUnavailable (retriable): a follower replica, or the fabric cannot be reached",
    504: "AttachTimeout (retriable): a Redfish task did not finish in time",
}
#: what any authenticated /api/v1 operation can answer
_COMMON = (401, 403, 413, 422, 429, 503)
#: what a few operations answer on top of that, keyed by (method, path)
_BY_OPERATION: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", f"{api.API_PREFIX}/attachments"): (404, 409, 502, 504),
    ("delete", f"{api.API_PREFIX}/attachments/{{device}}"): (404, 409, 502, 504),
    ("post", f"{api.API_PREFIX}/devices/{{device}}/reset"): (404, 409, 502, 504),
    ("get", f"{api.API_PREFIX}/devices/{{device}}"): (404,),
    ("get", f"{api.API_PREFIX}/operations/{{operation_id}}"): (404,),
    ("post", f"{api.API_PREFIX}/drains"): (404,),
    ("delete", f"{api.API_PREFIX}/drains"): (404,),
    ("get", f"{api.API_PREFIX}/usage"): (404,),
    ("get", f"{api.API_PREFIX}/inventory/changes"): (410,),
}
_RETRIABLE = (409, 429, 503, 504)


def complete_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """Add the security scheme and the error responses to a FastAPI-generated document."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error_schema = api.ErrorBody.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schemas["ErrorBody"] = error_schema
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a service-account token (plugin, controller) or an operator token",
    }
    for path, operations in document.get("paths", {}).items():
        if not path.startswith(api.API_PREFIX):
            continue
        for method, operation in operations.items():
            params = [
                p
                for p in operation.get("parameters", [])
                if not (p.get("in") == "header" and str(p.get("name", "")).lower() == "authorization")
            ]
            if params:
                operation["parameters"] = params
            else:
                operation.pop("parameters", None)
            operation["security"] = [{SECURITY_SCHEME: []}]
            responses = operation.setdefault("responses", {})
            for status in sorted({*_COMMON, *_BY_OPERATION.get((method, path), ())}):
                response: dict[str, Any] = {
                    "description": ERRORS[status],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                }
                if status in _RETRIABLE:
                    response["headers"] = {
                        "Retry-After": {
                            "description": "seconds to wait before asking again (retriable errors)",
                            "schema": {"type": "integer", "minimum": 1},
                        }
                    }
                responses[str(status)] = response
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the completed document at ``/openapi.json`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = complete_openapi(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
