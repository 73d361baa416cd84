"""What a verb handler needs besides the request: the server's parts, one :class:`RequestScope`
per server (``RequestScope`` of ``k8s.io/apiserver/pkg/endpoints/handlers/rest.go``), and the two
readings of the request every writing verb makes (``dryRun``, the caller).

A handler calls the parts it needs itself, in the order of ``create.go``/``update.go``: decode
(:mod:`kube_standin.apiserver.negotiation`) -> check group/version/kind, namespace and name
(:class:`~kube_standin.apiserver.requestinfo.RequestInfo`) -> validate against the schemas
(:func:`~kube_standin.apiserver.schemas.check_written`) -> convert to the storage version and
default (:func:`~kube_standin.apiserver.convert.storage_form`) -> the caller's admission
(:mod:`kube_standin.apiserver.admission`) -> the store, which runs the strategy and the server's
own rules inside its compare-and-swap (:func:`~kube_standin.apiserver.strategy.before_create`)
-> convert back to the version the client spoke (:func:`~kube_standin.apiserver.convert.from_storage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from kube_standin.apiserver.auth import TokenAuthenticator, TokenUser
from kube_standin.apiserver.customresources.served import CustomResources
from kube_standin.apiserver.features import ALL_SERVED, NEWEST_DEFAULTS, FeatureGates, ServedVersions
from kube_standin.apiserver.schemas import SchemaCatalog
from kube_standin.apiserver.status import bad_request
from kube_standin.apiserver.store import Store

__all__ = ["RequestScope", "dry_run", "request_user"]


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
    #: the resources the stored CRDs define, found next to the built-in ones.
    custom: CustomResources
    #: the feature gates of the emulated release (fields of disabled gates are dropped on write).
    gates: FeatureGates = NEWEST_DEFAULTS
    #: the group/versions served (beta APIs only where ``--runtime-config`` turns them on).
    served: ServedVersions = ALL_SERVED


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
