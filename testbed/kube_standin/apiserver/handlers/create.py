"""POST of a new object (and TokenReview, which is answered rather than stored).

As ``k8s.io/apiserver/pkg/endpoints/handlers/create.go`` (``CreateResource``): decode, check
the kind and namespace, validate, convert to the storage version, default, admit, store; the
answer is the created object in the version the client spoke, 201. An update of a missing
object whose kind allows it (``AllowCreateOnUpdate``) and an apply patch of a missing object
end here too (:func:`create_stored`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver import admission
from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.handlers.rest import (
    RequestScope,
    admit_create,
    check_type,
    dry_run,
    present,
    request_user,
    storage_form,
)
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.negotiation import decode_object_body
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from plumbing.logs import get_logger

__all__ = ["create_resource", "create_stored"]

log = get_logger(__name__)


def create_stored(
    scope: RequestScope, info: RequestInfo, stored: Obj, *, dry_run: bool, user: TokenUser | None
) -> Response:
    """Store ``stored`` (in its storage form) as a new object, if ``user``'s admission allows it:
    201 with what was created."""
    # create.go: the admission name is the object's metadata.name (not a generateName).
    admission.admit(user, "CREATE", info.res, str(stored["metadata"].get("name") or ""), stored, None)
    created = scope.store.create(info.res, stored, dry_run=dry_run, admit=admit_create(info.res, scope.gates))
    log.debug("created", resource=info.res.group_resource, name=created["metadata"]["name"])
    return json_response(present(info, created), 201)


def _token_review(scope: RequestScope, obj: Obj) -> Response:
    spec = obj.get("spec") or {}
    review = {
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": scope.auth.review(spec),
    }
    return json_response(review, 201)


async def create_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    is_dry_run = dry_run(request)
    obj = check_type(info, await decode_object_body(request))
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName") or ""
    scope.schema_check(info, obj, name)
    if info.res.kind == "TokenReview":
        return _token_review(scope, obj)
    return create_stored(scope, info, storage_form(info, obj), dry_run=is_dry_run, user=request_user(request))
