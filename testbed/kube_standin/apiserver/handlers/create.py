"""POST of a new object (and TokenReview, which is answered rather than stored).

As ``k8s.io/apiserver/pkg/endpoints/handlers/create.go`` (``CreateResource``): decode, check
the kind and namespace, validate, convert to the storage version, default, admit, store; the
answer is the created object in the version the client spoke, 201.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver.handlers.scope import RequestScope, dry_run, request_user
from kube_standin.apiserver.handlers.write import create_stored, with_warnings, written_form
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.negotiation import decode_object_body
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.schemas import check_written

__all__ = ["create_resource"]


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
    obj = info.check_object(await decode_object_body(request))
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName") or ""
    if info.res.kind == "TokenReview":
        check_written(scope.catalog, info.res, obj, name)
        return _token_review(scope, obj)
    stored, warnings = written_form(scope, request, info, obj, name)
    return with_warnings(
        create_stored(scope, info, stored, dry_run=is_dry_run, user=request_user(request)), warnings
    )
