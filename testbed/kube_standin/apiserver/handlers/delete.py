"""DELETE of one object and of a collection (deletecollection).

As ``k8s.io/apiserver/pkg/endpoints/handlers/delete.go`` (``DeleteResource``,
``DeleteCollection``): an optional ``DeleteOptions`` body carries preconditions (``uid``,
``resourceVersion``), ``dryRun`` and ``orphanDependents``; the answer is the object as it was
deleted (or as it now waits for its finalizers), 200 — 202 only where delete.go answers 202.
A deletecollection deletes what the selectors select and answers with the list of it.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver import admission, policies
from kube_standin.apiserver.convert import from_storage, list_item
from kube_standin.apiserver.handlers.scope import RequestScope, dry_run, request_user
from kube_standin.apiserver.negotiation import read_limited_body
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.selectors import selection
from kube_standin.apiserver.status import bad_request

__all__ = ["delete_collection", "delete_resource"]


async def _delete_options(request: Request) -> tuple[str | None, str | None, bool, bool | None]:
    """(uid precondition, resourceVersion precondition, dry run, orphanDependents)."""
    is_dry_run = dry_run(request)
    # limitedReadBody: DeleteOptions are read within the same 3 MiB limit as any body.
    raw = await read_limited_body(request)
    uid = rv = None
    orphan: bool | None = None
    if raw.strip():
        try:
            options = json.loads(raw)
        except ValueError as err:
            raise bad_request(f"DeleteOptions are not valid JSON: {err}") from err
        if not isinstance(options, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        pre = options.get("preconditions") or {}
        uid, rv = pre.get("uid"), pre.get("resourceVersion")
        if "All" in (options.get("dryRun") or []):
            is_dry_run = True
        if isinstance(options.get("orphanDependents"), bool):
            orphan = options["orphanDependents"]
    return uid, rv, is_dry_run, orphan


async def delete_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    uid, rv, is_dry_run, orphan = await _delete_options(request)
    user = request_user(request)
    admission.admit(user, "DELETE", info.res, info.name, None, None)
    stored = scope.store.find(info.res, info.namespace, info.name)
    if stored is not None:
        shown = from_storage(info.res, info.version, stored)
        policies.validate(
            scope.store, user, "DELETE", info.res, None, info.version, info.name, info.namespace, None, shown
        )
    obj, deleted = scope.store.delete(
        info.res, info.namespace, info.name, uid=uid, resource_version=rv, dry_run=is_dry_run
    )
    if deleted and not is_dry_run and info.res.kind == "CustomResourceDefinition":
        scope.custom.purge(obj)
    # delete.go: 202 only when the deletion is pending and the client asked for
    # orphanDependents=false; everything else is 200 (changing that would break clients).
    shown = from_storage(info.res, info.version, obj)
    return json_response(shown, 202 if not deleted and orphan is False else 200)


async def delete_collection(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    match = selection(request.query_params, info.res)
    _, _, is_dry_run, _ = await _delete_options(request)
    # delete.go's DeleteCollection admits the whole collection once, under an empty name.
    admission.admit(request_user(request), "DELETE", info.res, "", None, None)
    deleted = []
    for obj in list(scope.store.objects(info.res, info.namespace)):
        if not match(obj):
            continue
        meta = obj["metadata"]
        shown = from_storage(info.res, info.version, obj)
        policies.validate(
            scope.store,
            request_user(request),
            "DELETE",
            info.res,
            None,
            info.version,
            str(meta["name"]),
            meta.get("namespace"),
            None,
            shown,
        )
        gone_obj, _ = scope.store.delete(info.res, meta.get("namespace"), meta["name"], dry_run=is_dry_run)
        deleted.append(list_item(info.res, info.version, gone_obj))
    return json_response(
        {
            "kind": f"{info.res.kind}List",
            "apiVersion": info.api_version,
            "metadata": {"resourceVersion": str(scope.store.rv)},
            "items": deleted,
        }
    )
