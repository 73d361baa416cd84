"""Content negotiation and request bodies: which media types a request may send and ask for,
and reading a body within the server's size limit.

As ``k8s.io/apiserver/pkg/endpoints/handlers/negotiation`` (media types; a body in an unknown
one is 415) and ``limitedReadBody`` in ``handlers/rest.go`` (a body over the limit is 413).
Only JSON and YAML are spoken; protobuf and CBOR bodies are 415, as on a server without
those serializers.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from starlette.requests import Request

from kube_standin.apiserver.status import StatusError, bad_request, unsupported_media_type
from kube_standin.apiserver.tables import wants_table

__all__ = [
    "MAX_JSON_PATCH_OPERATIONS",
    "MAX_REQUEST_BYTES",
    "PATCH_TYPES",
    "decode_object_body",
    "decode_patch",
    "patch_type",
    "read_limited_body",
    "table_include",
]

#: the real server's request body limit (k8s.io/apiserver/pkg/server/config.go
#: ``MaxRequestBodyBytes``, 3 MiB: twice etcd's 1.5 MiB request limit, as JSON is larger than
#: the protobuf that is stored).
MAX_REQUEST_BYTES = 3 * 1024 * 1024
#: ``maxJSONPatchOperations`` in ``k8s.io/apiserver/pkg/endpoints/handlers/patch.go``: a JSON
#: patch with more operations is refused (413) before it is applied.
MAX_JSON_PATCH_OPERATIONS = 10_000

_OBJECT_TYPES = ("application/json", "", "application/yaml", "*/*")
#: the PATCH media types (``k8s.io/apimachinery/pkg/types/patch.go``) and what each is here.
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply-cbor",
}


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_limited_body(request: Request) -> bytes:
    """The body of a create, update or patch; 413 beyond :data:`MAX_REQUEST_BYTES`."""
    raw = await request.body()
    if len(raw) > MAX_REQUEST_BYTES:
        raise StatusError(
            413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BYTES}"
        )
    return raw


async def decode_object_body(request: Request) -> Any:
    """The object a create or update sends (JSON or YAML), not yet checked to be an object."""
    raw = await read_limited_body(request)
    content_type = _content_type(request)
    if content_type not in _OBJECT_TYPES:
        raise unsupported_media_type(content_type)
    if not raw.strip():
        raise bad_request("the request body is empty; an object is required")
    try:
        if content_type == "application/yaml":
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from err


def patch_type(request: Request) -> str:
    """What kind of patch the request's Content-Type announces (``merge``, ``strategic``,
    ``json`` or ``apply``); 415 for anything else, CBOR apply patches included."""
    content_type = _content_type(request)
    kind = PATCH_TYPES.get(content_type)
    if kind is None or kind == "apply-cbor":
        raise unsupported_media_type(content_type)
    return kind


def decode_patch(raw: bytes, kind: str) -> Any:
    """The patch document: YAML for apply patches, JSON for the others; a JSON patch of more
    than :data:`MAX_JSON_PATCH_OPERATIONS` operations is 413."""
    try:
        patch = yaml.safe_load(raw) if kind == "apply" else json.loads(raw)
    except (ValueError, yaml.YAMLError) as err:
        raise bad_request(f"the patch is not valid {'YAML' if kind == 'apply' else 'JSON'}: {err}") from err
    if kind == "json" and isinstance(patch, list) and len(patch) > MAX_JSON_PATCH_OPERATIONS:
        raise StatusError(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: The allowed number of operations in a JSON patch is "
            f"{MAX_JSON_PATCH_OPERATIONS}, but the patch has {len(patch)}",
        )
    return patch


def table_include(request: Request) -> str | None:
    """The ``includeObject`` of a request that asks for a ``meta.k8s.io/v1`` Table
    (``Accept: ...;as=Table``), or None when it asks for the objects themselves."""
    if not wants_table(request.headers.get("accept", "")):
        return None
    return request.query_params.get("includeObject", "Metadata")
