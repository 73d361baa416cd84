"""The ``/scale`` subresource's storage: an ``autoscaling/v1`` Scale over an object's ``spec.replicas``.

As ``ScaleREST`` in ``kubernetes/pkg/registry/apps/deployment/storage/storage.go``: a read
shows the Scale (:func:`scale_of`), a write changes only ``spec.replicas`` (:func:`write_scale`,
with the Scale's resourceVersion as the precondition). The get, update and patch handlers use it
for ``.../scale`` as they use the store for the object itself.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.status import Cause, bad_request, invalid

__all__ = ["scale_of", "write_scale"]


def scale_of(obj: Obj) -> Obj:
    """The Scale of a stored object."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    match_labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": int(spec.get("replicas") or 0)},
        "status": {
            "replicas": int((obj.get("status") or {}).get("replicas") or 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())),
        },
    }


def write_scale(scope: RequestScope, info: RequestInfo, body: Any, *, dry_run: bool) -> Response:
    """Store the replicas of the Scale ``body`` (an update, or the result of a patch)."""
    assert info.name is not None
    if not isinstance(body, dict):
        raise bad_request("a Scale must be a JSON object")
    body.setdefault("apiVersion", "autoscaling/v1")
    body.setdefault("kind", "Scale")
    if scope.catalog.versions:
        problems = scope.catalog.validate(body)
        if problems:
            raise invalid(info.res, info.name, [Cause(e.path, e.reason, e.detail) for _, e in problems])
    replicas = (body.get("spec") or {}).get("replicas", 0)
    if not isinstance(replicas, int) or replicas < 0:
        raise invalid(
            info.res,
            info.name,
            [
                Cause(
                    "spec.replicas",
                    "FieldValueInvalid",
                    f"Invalid value: {replicas}: must be greater than or equal to 0",
                )
            ],
        )
    current = scope.store.get(info.res, info.namespace, info.name)
    updated_obj = dict(current)
    updated_obj["spec"] = {**(current.get("spec") or {}), "replicas": replicas}
    want_rv = (body.get("metadata") or {}).get("resourceVersion")
    updated_obj["metadata"] = {
        **current["metadata"],
        "resourceVersion": want_rv or current["metadata"]["resourceVersion"],
    }
    updated = scope.store.update(info.res, updated_obj, dry_run=dry_run)
    return json_response(scale_of(updated))
