"""PATCH of an object or of its ``/status`` or ``/scale`` subresource, and server-side apply.

As ``k8s.io/apiserver/pkg/endpoints/handlers/patch.go`` (``PatchResource``): the Content-Type
names the patch format; the patch applies to the object as the client's version shows it,
and the result goes through the same checks as an update. An apply patch
(``application/apply-patch+yaml``) needs ``fieldManager`` and creates a missing object; it is
otherwise merged like a strategic merge patch, without field ownership. The merge math is in
:mod:`kube_standin.apiserver.patchbodies`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver.convert import from_storage
from kube_standin.apiserver.handlers.scale import scale_of, write_scale
from kube_standin.apiserver.handlers.scope import RequestScope, dry_run, request_user
from kube_standin.apiserver.handlers.write import create_stored, update_stored, with_warnings, written_form
from kube_standin.apiserver.jsonobj import Obj, clone
from kube_standin.apiserver.negotiation import decode_patch, patch_type, read_limited_body
from kube_standin.apiserver.patchbodies import PatchError, apply_patch
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.status import StatusError, bad_request, not_found

__all__ = ["patch_resource"]


def _patched(scope: RequestScope, kind: str, base: Obj, patch: Any) -> Any:
    """``base`` with ``patch`` applied, as a document of its own: the patch result may share
    unpatched parts with the stored object, and what follows (defaults, server fields) writes into it."""
    try:
        return clone(apply_patch(kind, base, patch, scope.catalog))
    except PatchError as err:
        raise StatusError(422, "Invalid", f"the patch could not be applied: {err}") from err


async def patch_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    is_dry_run = dry_run(request)
    kind = patch_type(request)
    if kind == "strategic" and info.res.custom is not None:
        # crdHandler serves no strategic merge patch: a custom resource has no patch strategies.
        raise StatusError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    patch = decode_patch(await read_limited_body(request), kind)
    current = scope.store.find(info.res, info.namespace, info.name)
    if kind == "apply":
        if not request.query_params.get("fieldManager"):
            raise bad_request("PATCH of type apply requires the fieldManager parameter")
        if current is None and not info.subresource:
            # an apply patch of a missing object is the object to create
            obj = info.check_object(patch)
            info.check_name(obj["metadata"].get("name"))
            stored, warnings = written_form(scope, request, info, obj, info.name)
            created = create_stored(scope, info, stored, dry_run=is_dry_run, user=request_user(request))
            return with_warnings(created, warnings)
    if current is None:
        raise not_found(info.res, info.name)
    if info.subresource == "scale":
        return write_scale(scope, info, _patched(scope, kind, scale_of(current), patch), dry_run=is_dry_run)
    patched = _patched(scope, kind, from_storage(info.res, info.version, current), patch)
    if not isinstance(patched, dict):
        raise bad_request("the patched document is not a JSON object")
    info.check_name((patched.get("metadata") or {}).get("name"))
    obj = info.check_object(patched)
    stored, warnings = written_form(scope, request, info, obj, info.name)
    updated = update_stored(scope, info, stored, dry_run=is_dry_run, user=request_user(request))
    return with_warnings(updated, warnings)
