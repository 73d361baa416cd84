"""PUT of an object or of its ``/status`` or ``/scale`` subresource.

As ``k8s.io/apiserver/pkg/endpoints/handlers/update.go`` (``UpdateResource``): the name in
the body must be the one on the URL; a stale ``metadata.resourceVersion`` is 409 (the store's
compare-and-swap); a missing object is 404, or created when the kind allows create-on-update
(Events, Leases: their strategies' ``AllowCreateOnUpdate``). Which fields a write to the main
resource or to ``/status`` may change is the store's business (the kinds' strategies).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver import admission
from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.handlers.create import create_stored
from kube_standin.apiserver.handlers.rest import (
    RequestScope,
    admit_update,
    check_type,
    dry_run,
    name_mismatch,
    present,
    request_user,
    storage_form,
)
from kube_standin.apiserver.handlers.scale import write_scale
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.negotiation import decode_object_body
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.status import not_found

__all__ = ["update_resource", "update_stored"]


def update_stored(
    scope: RequestScope, info: RequestInfo, stored: Obj, *, dry_run: bool, user: TokenUser | None
) -> Response:
    """Replace the object with ``stored`` (its storage form), if ``user``'s admission allows it:
    200 with the result."""
    assert info.name is not None
    old = scope.store.find(info.res, info.namespace, info.name)
    if old is not None:
        # Admission sees the object as the request makes it, before the store keeps a status
        # write to the status (and nothing else: no await in between, so ``old`` stays current).
        admission.admit(user, "UPDATE", info.res, info.name, stored, old)
    updated = scope.store.update(
        info.res,
        stored,
        subresource=info.subresource,
        dry_run=dry_run,
        admit=admit_update(info.res, info.subresource, scope.gates),
    )
    return json_response(present(info, updated))


async def update_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    is_dry_run = dry_run(request)
    body = await decode_object_body(request)
    if info.subresource == "scale":
        return write_scale(scope, info, body, dry_run=is_dry_run)
    obj = check_type(info, body)
    body_name = obj["metadata"].get("name")
    if body_name != info.name:
        raise name_mismatch(body_name, info.name)
    scope.schema_check(info, obj, info.name)
    stored = storage_form(info, obj)
    if scope.store.find(info.res, info.namespace, info.name) is None:
        if not info.res.create_on_update or info.subresource:
            raise not_found(info.res, info.name)
        stored["metadata"].pop("resourceVersion", None)
        return create_stored(scope, info, stored, dry_run=is_dry_run, user=request_user(request))
    return update_stored(scope, info, stored, dry_run=is_dry_run, user=request_user(request))
