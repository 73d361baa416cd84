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

from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.handlers.create import create_stored
from kube_standin.apiserver.handlers.rest import (
    RequestScope,
    check_type,
    dry_run,
    name_mismatch,
    present,
    request_user,
    storage_form,
)
from kube_standin.apiserver.handlers.scale import scale_of, write_scale
from kube_standin.apiserver.handlers.update import update_stored
from kube_standin.apiserver.jsonobj import Obj, clone
from kube_standin.apiserver.negotiation import decode_patch, patch_type, read_limited_body
from kube_standin.apiserver.patchbodies import (
    PatchError,
    SchemaNode,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.status import StatusError, bad_request, not_found

__all__ = ["patch_resource"]


def _patch_schema(scope: RequestScope, obj: Obj) -> SchemaNode | None:
    # Strategic merge reads the list merge keys from the newest configured release's schema.
    if not scope.catalog.sets:
        return None
    schema_set = scope.catalog.sets[-1]
    kind = schema_set.kind(str(obj.get("apiVersion")), str(obj.get("kind")))
    if kind is None:
        return None
    return SchemaNode(kind.top, schema_set.resolve)


def _apply_create(
    scope: RequestScope, info: RequestInfo, patch: Any, *, dry_run: bool, user: TokenUser | None
) -> Response:
    obj = check_type(info, patch)
    if obj["metadata"].get("name") != info.name:
        raise name_mismatch(obj["metadata"].get("name"), info.name)
    scope.schema_check(info, obj, info.name or "")
    return create_stored(scope, info, storage_form(info, obj), dry_run=dry_run, user=user)


def _apply(scope: RequestScope, kind: str, base: Obj, patch: Any) -> Any:
    try:
        if kind == "merge":
            return apply_merge_patch(base, patch)
        if kind == "json":
            return apply_json_patch(base, patch)
        if not isinstance(patch, dict):
            raise PatchError("a strategic merge patch must be a JSON object")
        return apply_strategic_merge_patch(base, patch, _patch_schema(scope, base))
    except PatchError as err:
        raise StatusError(422, "Invalid", f"the patch could not be applied: {err}") from err


async def patch_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    is_dry_run = dry_run(request)
    kind = patch_type(request)
    patch = decode_patch(await read_limited_body(request), kind)
    res = info.res
    current = scope.store.find(res, info.namespace, info.name)
    if kind == "apply":
        if not request.query_params.get("fieldManager"):
            raise bad_request("PATCH of type apply requires the fieldManager parameter")
        if current is None and not info.subresource:
            return _apply_create(scope, info, patch, dry_run=is_dry_run, user=request_user(request))
    if current is None:
        raise not_found(res, info.name)
    base = scale_of(current) if info.subresource == "scale" else present(info, current)
    # The patch result may share unpatched parts with the stored object; what follows
    # (defaults, server fields) writes into it, so it gets a document of its own.
    patched = clone(_apply(scope, kind, base, patch))
    if info.subresource == "scale":
        return write_scale(scope, info, patched, dry_run=is_dry_run)
    if not isinstance(patched, dict):
        raise bad_request("the patched document is not a JSON object")
    meta = patched.get("metadata") or {}
    if meta.get("name") != info.name:
        raise name_mismatch(meta.get("name"), info.name)
    obj = check_type(info, patched)
    scope.schema_check(info, obj, info.name)
    return update_stored(scope, info, storage_form(info, obj), dry_run=is_dry_run, user=request_user(request))
