"""Where every writing verb ends: the caller's admission (:mod:`kube_standin.apiserver.admission`),
then the store, which runs the kind's strategy and the server's own rules
(:mod:`kube_standin.apiserver.strategy`) and then the stored ValidatingAdmissionPolicies
(:mod:`kube_standin.apiserver.policies`) inside its compare-and-swap; the answer is the result in
the version the client spoke.

As ``Create``/``Update`` of ``k8s.io/apiserver/pkg/registry/generic/registry/store.go``, handed the
admission of the request: a create, an update of a missing object whose kind allows it
(``AllowCreateOnUpdate``) and an apply patch of a missing object store a new object
(:func:`create_stored`); an update and a patch replace one (:func:`update_stored`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver import admission, policies
from kube_standin.apiserver.auth import TokenUser
from kube_standin.apiserver.convert import from_storage, storage_form
from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.schemas import check_written
from kube_standin.apiserver.strategy import before_create, before_update
from plumbing.logs import get_logger

__all__ = ["create_stored", "update_stored", "with_warnings", "written_form"]

log = get_logger(__name__)


def written_form(
    scope: RequestScope, request: Request, info: RequestInfo, obj: Obj, name: str
) -> tuple[Obj, list[str]]:
    """A written object (checked for kind and namespace) as the store keeps it, and the warnings to
    answer with. A built-in kind is checked against the release's schemas (422); a custom resource
    is decoded as its CRD says: unknown fields pruned under the request's ``fieldValidation``
    (``Strict``: 400), defaults applied. Either way the result is in the storage version."""
    custom = info.res.custom
    if custom is None:
        check_written(scope.catalog, info.res, obj, name)
        return storage_form(info.res, info.version, obj), []
    decoded, warnings = custom.decode(info.version, obj, request.query_params.get("fieldValidation", ""))
    return storage_form(info.res, info.version, decoded), warnings


def with_warnings(response: Response, warnings: list[str]) -> Response:
    """``response`` with one ``Warning: 299 - "<text>"`` header per warning (``warning.AddWarning``
    in ``k8s.io/apiserver/pkg/endpoints/handlers/rest.go``; kubectl prints each)."""
    for text in warnings:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.append("Warning", f'299 - "{escaped}"')
    return response


def create_stored(
    scope: RequestScope, info: RequestInfo, stored: Obj, *, dry_run: bool, user: TokenUser | None
) -> Response:
    """Store ``stored`` (in its storage form) as a new object, if ``user``'s admission allows it:
    201 with what was created."""
    # create.go: the admission name is the object's metadata.name (not a generateName).
    name = str(stored["metadata"].get("name") or "")
    admission.admit(user, "CREATE", info.res, name, stored, None)
    prepare = before_create(info.res, scope.gates)

    def admit(new: Obj) -> None:
        prepare(new)
        shown = from_storage(info.res, info.version, new)
        policies.validate(
            scope.store,
            user,
            "CREATE",
            info.res,
            info.subresource,
            info.version,
            name,
            info.namespace,
            shown,
            None,
        )

    created = scope.store.create(info.res, stored, dry_run=dry_run, admit=admit)
    log.debug("created", resource=info.res.group_resource, name=created["metadata"]["name"])
    return json_response(from_storage(info.res, info.version, created), 201)


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
    prepare = before_update(info.res, info.subresource, scope.gates)

    def admit(new: Obj, old: Obj) -> None:
        prepare(new, old)
        policies.validate(
            scope.store,
            user,
            "UPDATE",
            info.res,
            info.subresource,
            info.version,
            info.name or "",
            info.namespace,
            from_storage(info.res, info.version, new),
            from_storage(info.res, info.version, old),
        )

    updated = scope.store.update(info.res, stored, subresource=info.subresource, dry_run=dry_run, admit=admit)
    return json_response(from_storage(info.res, info.version, updated))
