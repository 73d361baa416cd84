"""What every verb handler shares: the server's parts (:class:`RequestScope`) and the steps a
request's object goes through between the wire and the store.

Modelled on ``k8s.io/apiserver/pkg/endpoints/handlers/rest.go``: ``RequestScope`` (what a
handler needs besides the request), ``checkName`` (the name in the body must be the name on
the URL), ``isDryRun``; and on ``create.go``/``update.go`` for the order of the steps: decode ->
check group/version/kind and namespace -> validate against the schemas -> convert to the
storage version -> default -> admission of the caller (:mod:`kube_standin.apiserver.admission`,
the real server's mutating admission stage) -> admit (the server's own rules, run by the store
inside its compare-and-swap) -> store -> convert back to the version the client spoke.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from kube_standin.apiserver import rules
from kube_standin.apiserver.auth import TokenAuthenticator, TokenUser
from kube_standin.apiserver.convert import apply_defaults, from_storage, to_storage
from kube_standin.apiserver.features import ALL_SERVED, NEWEST_DEFAULTS, FeatureGates, ServedVersions
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.schemas import SchemaCatalog
from kube_standin.apiserver.selectors import SelectorError, parse_field_selector, parse_label_selector
from kube_standin.apiserver.status import Cause, StatusError, bad_request, invalid
from kube_standin.apiserver.store import Store
from kube_standin.apiserver.strategy import prepare_for_create, prepare_for_update

__all__ = [
    "RequestScope",
    "admit_create",
    "admit_update",
    "check_type",
    "dry_run",
    "list_item",
    "list_kind",
    "name_mismatch",
    "present",
    "request_user",
    "selection",
    "storage_form",
]


@dataclass(frozen=True, slots=True)
class RequestScope:
    """The server's parts a verb handler works with; one per server."""

    store: Store
    catalog: SchemaCatalog
    auth: TokenAuthenticator
    #: how often an idle watch with allowWatchBookmarks gets a BOOKMARK.
    bookmark_interval: float
    #: a watch without timeoutSeconds ends after a random time in [min, 2*min].
    min_request_timeout: float
    #: the feature gates of the emulated release (fields of disabled gates are dropped on write).
    gates: FeatureGates = NEWEST_DEFAULTS
    #: the group/versions served (beta APIs only where ``--runtime-config`` turns them on).
    served: ServedVersions = ALL_SERVED

    def schema_check(self, info: RequestInfo, obj: Obj, name: str) -> None:
        """422 unless ``obj`` satisfies the schemas of every configured Kubernetes version that
        serves its kind (none configured: no check)."""
        api_version = str(obj.get("apiVersion"))
        kind = str(obj.get("kind"))
        if not self.catalog.versions:
            return
        plan = self.catalog.plan(api_version, kind)
        if not plan:
            raise invalid(
                info.res,
                name,
                [
                    Cause(
                        "apiVersion",
                        "FieldValueNotSupported",
                        f"{kind} {api_version} is not served by Kubernetes "
                        + ", ".join(self.catalog.versions),
                    )
                ],
            )
        problems = self.catalog.validate(obj)
        if problems:
            all_versions = set(self.catalog.served_by(api_version, kind))
            causes = []
            for versions, error in problems[:50]:
                where = (
                    ""
                    if set(versions) == all_versions
                    else f" (Kubernetes {', '.join(sorted(set(versions)))})"
                )
                causes.append(Cause(error.path, error.reason, error.detail + where))
            raise invalid(info.res, name, causes)


# -- reading objects out --------------------------------------------------------------------


def present(info: RequestInfo, obj: Obj) -> Obj:
    """A stored object in the version the request spoke."""
    return from_storage(info.res, info.version, obj)


def list_item(info: RequestInfo, obj: Obj) -> Obj:
    shown = dict(present(info, obj))
    # A list's items carry no apiVersion/kind of their own, as on a real server.
    shown.pop("apiVersion", None)
    shown.pop("kind", None)
    return shown


def list_kind(info: RequestInfo) -> tuple[str, str]:
    """(kind, apiVersion) of a list of the request's resource."""
    return f"{info.res.kind}List", info.api_version


def selection(request: Request, res: ResourceType) -> Callable[[Obj], bool]:
    """Which objects the request's ``labelSelector`` and ``fieldSelector`` select (400 for a
    selector that does not parse or names a field the kind cannot be selected by)."""
    try:
        labels = parse_label_selector(request.query_params.get("labelSelector"))
        fields = parse_field_selector(request.query_params.get("fieldSelector"), res.selectable_fields())
    except SelectorError as err:
        raise bad_request(str(err)) from err
    if labels.empty and fields.empty:
        return lambda obj: True

    def match(obj: Obj) -> bool:
        return labels.matches((obj.get("metadata") or {}).get("labels")) and fields.matches(obj)

    return match


# -- writing objects in ---------------------------------------------------------------------


def request_user(request: Request) -> TokenUser | None:
    """Who sent the request (the pipeline's authentication stage); None when anonymous or when the
    server runs without a tokens file."""
    user = getattr(request.state, "user", None)
    return user if isinstance(user, TokenUser) else None


def dry_run(request: Request) -> bool:
    """Whether the request is ``dryRun=All`` (400 for any other dryRun value)."""
    values = request.query_params.getlist("dryRun")
    for value in values:
        if value != "All":
            raise bad_request(f'Invalid dryRun value "{value}": only "All" is supported')
    return bool(values)


def name_mismatch(body_name: Any, url_name: str | None) -> StatusError:
    """rest.go checkName's answer when the object's name is not the one on the URL."""
    return bad_request(
        f"the name of the object ({body_name or ''}) does not match the name on the URL ({url_name})"
    )


def check_type(info: RequestInfo, obj: Any) -> Obj:
    """``obj`` as an object of the request's kind and version (missing ``apiVersion``/``kind``
    filled in), in the request's namespace; 400 when it names another."""
    if not isinstance(obj, dict):
        raise bad_request("the request body must be a JSON object")
    expected_av = info.api_version
    api_version = obj.setdefault("apiVersion", expected_av)
    kind = obj.setdefault("kind", info.res.kind)
    if api_version != expected_av:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match "
            f"the expected API version ({expected_av})"
        )
    if kind != info.res.kind:
        raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({info.res.kind})")
    meta = obj.get("metadata")
    if meta is None:
        obj["metadata"] = meta = {}
    if not isinstance(meta, dict):
        raise bad_request("metadata must be a JSON object")
    if info.res.namespaced:
        body_ns = meta.get("namespace")
        if body_ns and info.namespace and body_ns != info.namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if info.namespace:
            meta["namespace"] = info.namespace
    return obj


def _finalize_secret(res: ResourceType, obj: Obj) -> None:
    # The API server folds stringData into data (base64) and never stores stringData.
    if res.kind != "Secret":
        return
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, dict) and string_data:
        data = obj.setdefault("data", {}) or {}
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data


def storage_form(info: RequestInfo, obj: Obj) -> Obj:
    """A written object (checked, in the requested version) as the store keeps it."""
    stored = to_storage(info.res, info.version, obj)
    apply_defaults(info.res, stored)
    _finalize_secret(info.res, stored)
    return stored


def _rules_check(res: ResourceType, name: str, causes: list[Cause]) -> None:
    if causes:
        raise invalid(res, name, causes)


def admit_create(res: ResourceType, gates: FeatureGates) -> Callable[[Obj], None]:
    """The strategy's ``PrepareForCreate`` (fields of disabled gates dropped), then the server's
    own rules for a new object, as the store's admission step."""

    def admit(obj: Obj) -> None:
        prepare_for_create(res, obj, gates)
        _rules_check(res, obj["metadata"].get("name", ""), rules.validate_object(res, obj, gates))

    return admit


def admit_update(
    res: ResourceType, subresource: str | None, gates: FeatureGates
) -> Callable[[Obj, Obj], None]:
    """``PrepareForUpdate``, then the server's own rules for an update (of ``subresource``), as the
    store's admission step."""

    def admit(new: Obj, old: Obj) -> None:
        prepare_for_update(res, new, old, gates)
        _rules_check(res, new["metadata"]["name"], rules.validate_update(res, new, old, subresource, gates))

    return admit
