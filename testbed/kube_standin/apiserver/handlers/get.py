"""GET of one object and of a collection (list), as Tables too.

As ``k8s.io/apiserver/pkg/endpoints/handlers/get.go`` (``GetResource``, ``ListResource``):
a list honours selectors, ``limit``/``continue`` pages (consistent: later pages show the state
at the first page's resourceVersion) and ``resourceVersion`` with ``resourceVersionMatch``;
a request with ``Accept: ...;as=Table`` gets a ``meta.k8s.io/v1`` Table instead. The continue
token is modelled on the real server's (``k8s.io/apiserver/pkg/storage/continue.go``):
base64url JSON ``{"v": "meta.k8s.io/v1", "rv": N, "start": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import json

from starlette.requests import Request
from starlette.responses import Response

from kube_standin.apiserver.convert import from_storage, list_item
from kube_standin.apiserver.handlers.scale import scale_of
from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.negotiation import table_include
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_response
from kube_standin.apiserver.selectors import selection
from kube_standin.apiserver.status import StatusError, bad_request
from kube_standin.apiserver.tables import table

__all__ = ["get_resource", "list_resource"]


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": [key[0], key[1]]}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        start = data["start"]
        return int(data["rv"]), (str(start[0]), str(start[1]))
    except (binascii.Error, ValueError, KeyError, TypeError, IndexError) as err:
        raise bad_request(f"continue key is not valid: {err}") from err


async def get_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    assert info.name is not None
    obj = scope.store.get(info.res, info.namespace, info.name)
    if info.subresource == "scale":
        return json_response(scale_of(obj))
    include = table_include(request)
    if include is not None:
        rv = obj["metadata"]["resourceVersion"]
        shown = from_storage(info.res, info.version, obj)
        return json_response(table(info.res, [shown], resource_version=rv, include=include))
    return json_response(from_storage(info.res, info.version, obj))


def _list_position(scope: RequestScope, request: Request) -> tuple[int | None, tuple[str, str] | None]:
    """(the resourceVersion to list at, None for the current state; the key the page starts
    after) from ``continue``, ``resourceVersion`` and ``resourceVersionMatch``."""
    params = request.query_params
    token = params.get("continue")
    rv_text = params.get("resourceVersion")
    rv_match = params.get("resourceVersionMatch")
    if token:
        if rv_text not in (None, ""):
            raise bad_request("specifying resource version is not allowed when using continue")
        at_rv, after = _decode_continue(token)
        return at_rv, after
    if rv_text not in (None, "", "0"):
        try:
            wanted = int(str(rv_text))
        except ValueError as err:
            raise bad_request(f"resourceVersion {rv_text!r} is not valid") from err
        if rv_match == "Exact":
            return wanted, None
        if wanted > scope.store.rv:
            raise StatusError(
                504, "Timeout", f"Too large resource version: {wanted}, current: {scope.store.rv}"
            )
    elif rv_match == "Exact":
        raise bad_request("resourceVersionMatch=Exact requires a resourceVersion")
    return None, None


async def list_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    match = selection(request.query_params, info.res)
    limit_text = request.query_params.get("limit")
    try:
        limit = int(limit_text) if limit_text else None
    except ValueError as err:
        raise bad_request(f"limit {limit_text!r} is not an integer") from err
    if limit is not None and limit < 0:
        raise bad_request("limit must not be negative")
    at_rv, after = _list_position(scope, request)
    page = scope.store.list_objects(
        info.res, info.namespace, match=match, limit=limit, after=after, at_rv=at_rv
    )
    continue_token = (
        _encode_continue(page.resource_version, page.continue_key) if page.continue_key is not None else None
    )
    include = table_include(request)
    if include is not None:
        rows = [from_storage(info.res, info.version, obj) for obj in page.items]
        rv = str(page.resource_version)
        return json_response(
            table(info.res, rows, resource_version=rv, include=include, continue_token=continue_token)
        )
    items = [list_item(info.res, info.version, obj) for obj in page.items]
    meta: Obj = {"resourceVersion": str(page.resource_version)}
    if continue_token is not None:
        meta["continue"] = continue_token
        meta["remainingItemCount"] = page.remaining
    return json_response(
        {"kind": f"{info.res.kind}List", "apiVersion": info.api_version, "metadata": meta, "items": items}
    )
