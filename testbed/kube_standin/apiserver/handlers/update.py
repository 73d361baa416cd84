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

from kube_standin.apiserver.handlers.scale import write_scale
from kube_standin.apiserver.handlers.scope import RequestScope, dry_run, request_user
from kube_standin.apiserver.handlers.write import create_stored, update_stored, with_warnings, written_form
from kube_standin.apiserver.negotiation import decode_object_body
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.status import not_found

__all__ = ["update_resource"]


async def update_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    is_dry_run = dry_run(request)
    body = await decode_object_body(request)
    if info.subresource == "scale":
        return write_scale(scope, info, body, dry_run=is_dry_run)
    obj = info.check_object(body)
    info.check_name(obj["metadata"].get("name"))
    stored, warnings = written_form(scope, request, info, obj, info.name)
    user = request_user(request)
    if scope.store.find(info.res, info.namespace, info.name) is None:
        if not info.res.create_on_update or info.subresource:
            raise not_found(info.res, info.name)
        stored["metadata"].pop("resourceVersion", None)
        return with_warnings(create_stored(scope, info, stored, dry_run=is_dry_run, user=user), warnings)
    return with_warnings(update_stored(scope, info, stored, dry_run=is_dry_run, user=user), warnings)
